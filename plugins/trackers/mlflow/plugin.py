"""mlflow: metrics, config and plan as an MLflow run, in RUN_DIR/mlruns (offline) unless asked.

By default rank 0 writes an MLflow run into a local file store in ``RUN_DIR/mlruns`` and sends
nothing anywhere; ``mlflow ui --backend-store-uri RUN_DIR/mlruns`` or
``MlflowClient(tracking_uri="file:RUN_DIR/mlruns")`` reads it. ``trackers.mlflow.tracking_uri``
names another store: a folder (``file:`` or a path) or a tracking server (``http(s)://``), which
then receives the run as it trains; its credentials come from MLflow's environment variables
(``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` or ``MLFLOW_TRACKING_TOKEN``),
never from the config, so they are never in the printed or saved config, the plan or the logs.

The run holds every metric of every logged step (names with characters MLflow refuses, such as
OLMo-core's ``optim/LR (group 0)``, get ``_`` for them: ``optim/LR _group 0_``), the resolved
config as parameters (dotted keys) and as ``olmx/config.yaml``, and the plan as
``olmx/plan.md``. A resume continues the same MLflow run (its id is kept in
``RUN_DIR/mlflow_run.json``); steps that a stopped attempt logged after its last checkpoint are
logged again by the resumed one (MLflow keeps every point: per step, the latest is the one that
counts). ``trainer.resume=false`` starts a new MLflow run. Needs ``pip install 'olmx[mlflow]'``
(``mlflow-skinny``). MLflow's own telemetry is turned off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from olmx.api import Context, Contribution, TrackerPlugin, require_package
from olmx.errors import ConfigError

#: URI schemes of ``trackers.mlflow.tracking_uri``: a local file store or a tracking server.
SCHEMES = ("file", "http", "https")
#: What the run holds, for the plan's rows.
WHAT = "every metric, the config, the plan"
#: The file in the run directory that keeps the MLflow run's id, so that a resume continues it.
RUN_FILE = "mlflow_run.json"


@dataclass(frozen=True)
class MLflowConfig:
    """Settings of ``trackers.mlflow``."""

    #: Where the run goes: null (the default) is a file store in ``RUN_DIR/mlruns``, nothing
    #: sent; ``file:/path`` or a path (relative: inside the run directory) is another file
    #: store; ``http(s)://host[:port]`` is a tracking server, sent to while training. Never with
    #: credentials: MLflow reads them from ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``.
    tracking_uri: Optional[str] = None
    #: MLflow experiment (created if missing).
    experiment: str = "olmx"
    #: Run name; null: the run directory's name.
    run_name: Optional[str] = None
    #: Tags of the run (``{team: nlp}``).
    tags: dict[str, str] = field(default_factory=dict)


class MLflow(TrackerPlugin):
    """Every metric, the resolved config and the plan as an MLflow run, offline unless asked."""

    name = "mlflow"
    api = ">=3.0,<4"
    Config = MLflowConfig

    def resolve(self, cfg: MLflowConfig, ctx: Context) -> Contribution:
        """Check the tracking URI and the experiment, and that ``mlflow`` is installed; say where the run goes."""
        field_name = f"{self.section}.tracking_uri"
        if not cfg.experiment.strip():
            raise ConfigError(f"{self.section}.experiment", "must name an MLflow experiment")
        require_package("mlflow", extra="mlflow", field=self.section)
        if cfg.tracking_uri is None:
            return Contribution(rows=[("writes", f"offline: file store RUN_DIR/mlruns ({WHAT}); nothing is sent")])
        parts = urlsplit(cfg.tracking_uri)
        scheme = parts.scheme or "file"
        if len(scheme) == 1:  # a Windows drive letter reads as a scheme
            scheme = "file"
        if scheme not in SCHEMES:
            raise ConfigError(
                field_name,
                f"'{scheme}:' is not a store olmx writes to; allowed: a folder (file: or a path) or a tracking server "
                f"(http:// or https://)",
            )
        if parts.username or parts.password:
            raise ConfigError(
                field_name,
                "holds credentials, which would end up in the saved config and the logs; put them in "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN instead",
            )
        if scheme == "file":
            shown = shown_path(cfg.tracking_uri)
            return Contribution(rows=[("writes", f"offline: file store {shown} ({WHAT}); nothing is sent")])
        if not parts.hostname:
            raise ConfigError(field_name, f"'{cfg.tracking_uri}' names no host")
        server = f"online: tracking server {cfg.tracking_uri}, experiment {cfg.experiment} ({WHAT})"
        return Contribution(rows=[("sends", server)])

    def callbacks(self, cfg: MLflowConfig, plan: Any) -> dict[str, Any]:
        """The callback that writes the MLflow run (the core adds it on rank 0)."""
        from olmx_plugins.trackers.common import plan_markdown
        from olmx_plugins.trackers.mlflow.callback import MLflowCallback

        return {
            "mlflow": MLflowCallback(
                tracking_uri=store_uri(plan.run_dir, cfg.tracking_uri),
                experiment=cfg.experiment,
                run_name=cfg.run_name or Path(plan.run_dir).name,
                tags=dict(cfg.tags),
                run_file=str(Path(plan.run_dir) / RUN_FILE),
                resuming=plan.resume_step is not None,
                config=plan.to_dict()["config"],
                config_yaml=plan.config_yaml(),
                plan_md=plan_markdown(plan),
            )
        }


def shown_path(value: str) -> str:
    """A file store as the plan shows it (relative paths read ``RUN_DIR/...``)."""
    path = value.removeprefix("file://").removeprefix("file:")
    return path if Path(path).is_absolute() else f"RUN_DIR/{path}"


def store_uri(run_dir: str, value: Optional[str]) -> str:
    """The tracking URI MLflow gets: a file store as an absolute ``file:`` URI (null: ``RUN_DIR/mlruns``)."""
    if value is None:
        value = "mlruns"
    elif urlsplit(value).scheme in ("http", "https"):
        return value
    path = Path(value.removeprefix("file://").removeprefix("file:"))
    return (Path(run_dir) / path if not path.is_absolute() else path).resolve().as_uri()


#: The plugin object the entry point names.
MLFLOW = MLflow()
