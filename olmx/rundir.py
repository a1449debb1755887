"""The run directory: the one owner of its layout, its file names and the launch record.

::

    RUN_DIR/
      plan.yaml        the resolved plan every process reads (olmx.plan)
      metrics.jsonl    one JSON record per logged step (olmx.worker.callbacks)
      summary.json     the run's summary, rewritten as it trains
      events.jsonl     starts, restarts, stops and their causes (olmx.events)
      launch.json      what the infra target launched (job id, pods), for ``olmx jobs``
      checkpoints/     OLMo-core checkpoints, stepN/
      logs/            node logs (nodeR.log) and torchrun's per-rank logs (logs/torchrun/)
      work/            OLMo-core's work files (dataset and loader indices, fault records)
      report/          ``olmx report``'s tables and plots

Torch-free and cheap to import: launchers, the worker and the report all use it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from olmx.errors import LaunchError

PLAN_FILE = "plan.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
LAUNCH_FILE = "launch.json"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
WORK = "work"
REPORT = "report"


class RunDir:
    """Paths and records of one run directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def plan(self) -> Path:
        """``plan.yaml``."""
        return self.path / PLAN_FILE

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``."""
        return self.path / METRICS_FILE

    @property
    def summary(self) -> Path:
        """``summary.json``."""
        return self.path / SUMMARY_FILE

    @property
    def events(self) -> Path:
        """``events.jsonl``."""
        return self.path / EVENTS_FILE

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/`` (OLMo-core's ``save_folder``)."""
        return self.path / CHECKPOINTS

    @property
    def logs(self) -> Path:
        """``logs/``."""
        return self.path / LOGS

    @property
    def torchrun_logs(self) -> Path:
        """Where torchrun keeps each attempt's per-rank logs and error files."""
        return self.logs / "torchrun"

    def node_log(self, node_rank: int) -> Path:
        """The output of node ``node_rank``'s torchrun and its workers."""
        return self.logs / f"node{node_rank}.log"

    @property
    def work(self) -> Path:
        """``work/`` (OLMo-core's ``work_dir``)."""
        return self.path / WORK

    @property
    def report(self) -> Path:
        """``report/``."""
        return self.path / REPORT

    def latest_checkpoint(self) -> int | None:
        """Step of the newest complete checkpoint (None if there is none)."""
        steps = []
        for p in self.checkpoints.glob("step*"):
            m = re.fullmatch(r"step(\d+)", p.name)
            if m and (p / ".metadata.json").is_file():
                steps.append(int(m.group(1)))
        return max(steps) if steps else None

    def write_launch(self, record: dict[str, Any]) -> None:
        """Record what an infra target launched (``launch.json``), replacing an older record."""
        path = self.path / LAUNCH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)

    def read_launch(self, infra: str) -> dict[str, Any]:
        """The launch record; :class:`LaunchError` when ``infra`` launched nothing here."""
        path = self.path / LAUNCH_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise LaunchError(f"{path} does not exist: this run was not launched on {infra}") from None


def tail(path: str | os.PathLike[str], lines: int = 30) -> str:
    """The last ``lines`` lines of a text file, read from its end; ``""`` when it does not
    exist (yet)."""
    try:
        f = open(path, "rb")
    except OSError:
        return ""
    with f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        while end > 0 and data.count(b"\n") <= lines:
            step = min(1 << 16, end)
            end -= step
            f.seek(end)
            data = f.read(step) + data
    text = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:]) if lines > 0 else ""
