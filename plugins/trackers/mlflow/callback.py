"""The mlflow tracker's OLMo-core callback (rank 0 only: the core adds it there)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo_core.train.callbacks import Callback

from olmx.metrics import canonical, mlflow_name

#: MLflow's limits: parameters per ``log_batch`` call and characters of a parameter value.
_PARAMS_PER_BATCH = 100
_PARAM_CHARS = 6000


def flat_params(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested config data as MLflow parameters: dotted keys, string values (lists as JSON)."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    value = json.dumps(data) if isinstance(data, (list, tuple)) else str(data)
    return {mlflow_name(prefix[:-1]): value[:_PARAM_CHARS]}


@dataclass
class MLflowCallback(Callback):
    """Writes every logged metric at its step, the config as parameters and files, the plan as a
    file, and the run's end state (FINISHED at the last step, KILLED when stopped, FAILED)."""

    #: MLflow tracking URI (a ``sqlite:`` database or a server).
    tracking_uri: str = ""
    #: Where a new experiment keeps its runs' artifacts (a ``file:`` URI; empty: the store's choice,
    #: a server's).
    artifact_location: str = ""
    #: Experiment name.
    experiment: str = "olmx"
    #: Run name.
    run_name: str = ""
    #: Run tags.
    tags: dict[str, str] = field(default_factory=dict)
    #: Where the run's id is kept (JSON: tracking URI and run id).
    run_file: str = ""
    #: Whether this attempt resumes from a checkpoint (then the kept run is continued).
    resuming: bool = False
    #: The resolved config (nested plain data), logged as parameters.
    config: dict[str, Any] = field(default_factory=dict)
    #: The resolved config as YAML, logged as ``olmx/config.yaml``.
    config_yaml: str = ""
    #: The plan as Markdown, logged as ``olmx/plan.md``.
    plan_md: str = ""
    _client: Any = field(default=None, repr=False)
    _run_id: str = field(default="", repr=False)

    def pre_train(self) -> None:
        """Open (or, resuming, reopen) the run; log the config and the plan."""
        # MLflow's usage telemetry would be the only network traffic of an offline run
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
        os.environ["DO_NOT_TRACK"] = "true"
        from mlflow import MlflowClient

        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        kept = self._kept_run_id()
        if kept:
            self._run_id = kept
            client.update_run(kept, status="RUNNING")
            return
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            exp_id = client.create_experiment(self.experiment, artifact_location=self.artifact_location or None)
        run = client.create_run(exp_id, run_name=self.run_name, tags=dict(self.tags))
        self._run_id = run.info.run_id
        run_file = Path(self.run_file)
        part = run_file.with_name(f"{run_file.name}.tmp{os.getpid()}")
        part.write_text(json.dumps({"tracking_uri": self.tracking_uri, "run_id": self._run_id}) + "\n")
        part.replace(run_file)  # whole or not at all
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_params(self.config).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            client.log_batch(self._run_id, params=params[i : i + _PARAMS_PER_BATCH])
        client.log_text(self._run_id, self.config_yaml, "olmx/config.yaml")
        client.log_text(self._run_id, self.plan_md, "olmx/plan.md")

    def _kept_run_id(self) -> str:
        """The run a resume continues: the one this run directory's earlier attempt opened in
        the same store, if it is still there."""
        path = Path(self.run_file)
        if not (self.resuming and path.is_file()):
            return ""
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            return ""
        if not isinstance(kept, dict) or kept.get("tracking_uri") != self.tracking_uri:
            return ""
        run_id = str(kept.get("run_id", ""))
        try:
            self._client.get_run(run_id)
        except Exception:  # deleted from the store, or never there: a new run
            return ""
        return run_id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Every numeric metric of the step under the run's name (:func:`olmx.metrics.canonical`:
        ``metrics.jsonl``'s), with the one substitution MLflow needs (:func:`olmx.metrics.mlflow_name`)."""
        if not self._run_id:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(name), value, now, step) for name, value in canonical(metrics).items()]
        if batch:
            self._client.log_batch(self._run_id, metrics=batch)

    def post_train(self) -> None:
        """FINISHED at the run's last step; KILLED when it stops before (a resume reopens it)."""
        if self._run_id:
            done = self.trainer.global_step >= (self.trainer.max_steps or 0)
            self._client.set_terminated(self._run_id, status="FINISHED" if done else "KILLED")

    def on_error(self, exc: BaseException) -> None:
        """FAILED."""
        if self._run_id:
            self._client.set_terminated(self._run_id, status="FAILED")
            self._run_id = ""
