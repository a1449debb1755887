"""The run directory's layout: its file names, the paths and records of one run directory
(:class:`RunDir`), the launch record, the ownership marker.

::

    RUN_DIR/
      plan.yaml        the resolved plan every process reads (olmx.plan)
      metrics.jsonl    one JSON record per logged step (olmx.worker.callbacks)
      summary.json     the run's summary, rewritten as it trains
      events.jsonl     starts, restarts, stops and their causes (olmx.events)
      launch.json      what the infra target launched (job id, pods), for ``olmx jobs``
      checkpoints/     OLMo-core checkpoints, stepN/
      logs/            node logs (nodeR.log) and torchrun's per-rank logs (logs/torchrun/)
      work/            OLMo-core's work files (dataset and loader indices, fault records,
                       the clock ledgers of olmx.goodput in work/clock/)
      report/          ``olmx report``'s tables and plots
      profile/         ``trainer.profile``'s Chrome traces and memory snapshots
      hang/            what the hang watchdog found, per attempt: every rank's heartbeat,
                       stack and process state, the verdict (olmx.worker.watchdog)
      .olmx-run        the marker: olmx created or claimed this folder (olmx writes and
                       removes files only in folders that carry it)
      .olmx-lock       held by the one ``olmx train`` that writes the run now (host, pid, start)

Torch-free and cheap to import: launchers, the worker and the report all use it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError, LaunchError
from olmx.rundir.lock import TAKEOVER_SUFFIX, Holder, RunLock, acquire, read_holder
from olmx.writable import write_text_atomic

PLAN_FILE = "plan.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
LAUNCH_FILE = "launch.json"
CHECKPOINTS = "checkpoints"
#: The file that marks ``checkpoints/stepN`` complete: OLMo-core 3.0.0's
#: ``Checkpointer.METADATA_FNAME``, written last, after olmx verified the files (a test holds
#: the two equal).
CHECKPOINT_MARK = ".metadata.json"
LOGS = "logs"
WORK = "work"
REPORT = "report"
PROFILE = "profile"
HANG = "hang"
MARKER_FILE = ".olmx-run"
LOCK_FILE = ".olmx-lock"
#: Prefix of the folders ``trainer.resume=false`` moves earlier checkpoints into.
OLD_CHECKPOINTS = "checkpoints.old-"
#: Files olmx itself writes into a folder before it carries the marker.
_OWN_FILES = {LOCK_FILE, LOCK_FILE + TAKEOVER_SUFFIX}


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
    def clock(self) -> Path:
        """``work/clock/``: every attempt's clock ledger (:mod:`olmx.goodput`)."""
        return self.work / "clock"

    @property
    def report(self) -> Path:
        """``report/``."""
        return self.path / REPORT

    @property
    def profile(self) -> Path:
        """``profile/``: ``trainer.profile``'s Chrome traces and memory snapshots."""
        return self.path / PROFILE

    @property
    def hang(self) -> Path:
        """``hang/``: the hang watchdog's heartbeats, stacks and verdicts, one folder per attempt."""
        return self.path / HANG

    def latest_checkpoint(self) -> int | None:
        """Step of the newest complete checkpoint (None if there is none)."""
        steps = []
        for p in self.checkpoints.glob("step*"):
            m = re.fullmatch(r"step(\d+)", p.name)
            if m and (p / CHECKPOINT_MARK).is_file():
                steps.append(int(m.group(1)))
        return max(steps) if steps else None

    def write_launch(self, record: dict[str, Any]) -> None:
        """Record what an infra target launched (``launch.json``), replacing an older record."""
        path = self.path / LAUNCH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")

    def read_launch(self, infra: str) -> dict[str, Any]:
        """The launch record; :class:`LaunchError` when ``infra`` launched nothing here."""
        path = self.path / LAUNCH_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise LaunchError(f"{path} does not exist: this run was not launched on {infra}") from None

    # -- ownership: the marker -----------------------------------------------------------------

    @property
    def marker(self) -> Path:
        """``.olmx-run``: olmx created or claimed this folder."""
        return self.path / MARKER_FILE

    def is_olmx(self) -> bool:
        """Whether the folder is olmx's: it has the marker, or it is a run directory of an olmx
        from before the marker (a ``plan.yaml`` that olmx wrote)."""
        if self.marker.is_file():
            return True
        try:
            return "olmx_version:" in self.plan.read_text(errors="replace")
        except OSError:
            return False

    def check_claimable(self, field: str = "trainer.run_dir") -> None:
        """:class:`ConfigError` when the folder exists, is not empty and is not olmx's: olmx
        would write (and, on ``trainer.resume=false``, move) files in a folder that is not its own."""
        try:
            entries = [p.name for p in self.path.iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise ConfigError(field, f"cannot read '{self.path}' ({exc.strerror})") from None
        if not set(entries) - _OWN_FILES or self.is_olmx():
            return
        shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
        raise ConfigError(
            field,
            f"'{self.path}' is a non-empty folder that olmx did not create (it holds {shown} and no "
            f"{MARKER_FILE} marker); olmx writes plan.yaml, metrics.jsonl and checkpoints/ into its run "
            f"directory: choose a new or empty folder (if it is a run directory of yours, create the "
            f"marker: touch {self.marker})",
        )

    def claim(self) -> None:
        """Write the marker (once): from now on the folder is olmx's run directory."""
        if self.marker.is_file():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        record = {"created_by": "olmx", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname()}
        self.marker.write_text(json.dumps(record) + "\n")

    # -- fresh starts --------------------------------------------------------------------------

    def has_checkpoints(self) -> bool:
        """Whether ``checkpoints/`` holds anything."""
        try:
            return any(self.checkpoints.iterdir())
        except OSError:
            return False

    def move_checkpoints_aside(self, *, now: float | None = None) -> Path | None:
        """``trainer.resume=false``: rename ``checkpoints/`` to ``checkpoints.old-<time>/`` (one
        rename: nothing is copied or deleted); returns where, None when there was nothing."""
        if not self.has_checkpoints():
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        dest = self.path / f"{OLD_CHECKPOINTS}{stamp}"
        n = 1
        while dest.exists():
            dest = self.path / f"{OLD_CHECKPOINTS}{stamp}-{n}"
            n += 1
        self.checkpoints.rename(dest)
        return dest

    # -- one writer: the lock ------------------------------------------------------------------

    @property
    def lock_file(self) -> Path:
        """``.olmx-lock``."""
        return self.path / LOCK_FILE

    def lock_holder(self) -> Holder | None:
        """Who holds the lock now (None: nobody, or a lock being written this instant)."""
        return read_holder(self.lock_file)

    def acquire(self, *, field: str = "trainer.run_dir", command: str = "olmx train") -> RunLock:
        """Take the run directory's lock (creating the folder), or raise :class:`ConfigError`
        naming the holder (:func:`olmx.rundir.lock.acquire`). A stale lock is taken over; the
        returned lock says whose (:attr:`RunLock.took_over`). Puts the token into
        ``os.environ[LOCK_ENV]``, so that every process started from here holds the lock too."""
        self.path.mkdir(parents=True, exist_ok=True)
        return acquire(self.path, self.lock_file, field=field, command=command)


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
