"""The clock ledger of one attempt (rank 0): where its wall time goes, for :mod:`olmx.goodput`.

The Trainer's hooks split every step: waiting for the batch (``pre_load_batch`` to
``pre_step``), the step's work (to ``post_train_batch``, the optimizer step included), a
checkpoint save (OLMo-core's checkpointer saves in ``post_train_batch``, to
``post_checkpoint_saved``), then what runs after the step (``post_step`` to the next
``pre_load_batch``): an evaluation, the metrics. The callback runs before every other
callback's hooks, so each mark comes before the work it times. The ledger is written after
every step (one small file, rank 0: a fraction of a millisecond) and at the end.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from olmo_core.train.callbacks import Callback

from olmx.events import LAUNCH_ENV, LAUNCH_TIME_ENV
from olmx.rundir import RunDir, process_start
from olmx.writable import write_text_atomic


def process_started() -> float:
    """This process's start, Unix time (from ``/proc``; now where that is unknown)."""
    try:
        ticks = process_start(os.getpid())
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        if ticks is not None:
            return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        pass
    return time.time()


@dataclass
class Clock(Callback):
    """Rank 0's ledger of its attempt (module doc); the other ranks keep none."""

    #: First of every hook: its marks come before the work they time.
    priority: ClassVar[int] = 10**6
    run_dir: str = ""
    attempt: int = 0
    #: Steps between evaluations (0: none): the time after such a step is the evaluation's.
    eval_interval: int = 0
    resumed_from: int | None = None
    _ledger: dict[str, Any] = field(default_factory=dict, repr=False)
    _marks: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> Path:
        """``RUN_DIR/work/clock/<launch>-<attempt>.json``."""
        launch = os.environ.get(LAUNCH_ENV) or "manual"
        return RunDir(self.run_dir).clock / f"{launch}-{self.attempt}.json"

    def pre_train(self) -> None:
        """Open the ledger."""
        launch_time = os.environ.get(LAUNCH_TIME_ENV)
        self._ledger = {
            "launch": os.environ.get(LAUNCH_ENV),
            "attempt": self.attempt,
            "resumed_from": self.resumed_from,
            "launch_time": float(launch_time) if launch_time else None,
            "process_start": process_started(),
            "first_step_start": None,
            "last_step": self.resumed_from,
            "steps": {"data": 0.0, "compute": 0.0, "evaluation": 0.0, "checkpointing": 0.0, "first": 0.0, "count": 0},
            "checkpoints": {},
        }
        self._write()

    def pre_load_batch(self) -> None:
        """The previous step's aftermath ends; this one waits for its batch."""
        now = time.perf_counter()
        self._aftermath(now)
        self._marks["load"] = now
        if self._ledger.get("first_step_start") is None:
            self._ledger["first_step_start"] = time.time()

    def pre_step(self, batch: dict[str, Any]) -> None:
        """The batch is here; the step begins."""
        now = time.perf_counter()
        self._ledger["steps"]["data"] += now - self._marks.get("load", now)
        self._marks["step"] = now

    def post_train_batch(self) -> None:
        """The step's work ended (its optimizer step included); a checkpoint save may follow."""
        now = time.perf_counter()
        steps = self._ledger["steps"]
        took = now - self._marks.get("step", now)
        steps["compute"] += took
        if steps["count"] == 0:  # the attempt's first step, waiting for its batch included
            steps["first"] = took + self._marks.get("step", now) - self._marks.get("load", now)
        steps["count"] += 1
        self._marks["saved"] = now

    def post_checkpoint_saved(self, path: Any) -> None:
        """A save ended: its time, and the step time the checkpoint keeps."""
        now = time.perf_counter()
        steps = self._ledger["steps"]
        steps["checkpointing"] += now - self._marks.get("saved", now)
        self._marks["saved"] = now
        self._ledger["checkpoints"][str(self.step)] = round(steps["compute"] + steps["data"], 3)
        self._write(progress=True)

    def post_step(self) -> None:
        """The step is done (before the evaluators run): the ledger is written."""
        self._ledger["last_step"] = self.step
        self._marks["after"] = time.perf_counter()
        self._write(progress=True)

    def post_train(self) -> None:
        """The last step's aftermath ends (the final save that follows calls
        :meth:`post_checkpoint_saved`)."""
        now = time.perf_counter()
        self._aftermath(now)
        self._marks["saved"] = now

    def close(self) -> None:
        """Write the ledger a last time (however the attempt ends: ``updated`` moves, ``progress``
        stays at the last step or save, so a failure's wait counts to the restart)."""
        if self._ledger:
            self._write()

    def _aftermath(self, now: float) -> None:
        """What ran after the last step: its evaluation (or the bookkeeping, which stays
        unaccounted: ``waiting``)."""
        after = self._marks.pop("after", None)
        if after is not None and self.eval_interval and self.step % self.eval_interval == 0:
            self._ledger["steps"]["evaluation"] += now - after

    def _write(self, progress: bool = False) -> None:
        from olmo_core.distributed.utils import get_rank

        if get_rank() != 0 or not self._ledger:
            return
        self._ledger["updated"] = time.time()
        if progress or "progress" not in self._ledger:
            self._ledger["progress"] = self._ledger["updated"]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(self._ledger))
        except OSError:
            pass  # a full disk must not end the run from here
