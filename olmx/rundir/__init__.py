"""The run directory: the one owner of its layout, its file names, the launch record and the
lock that keeps one writer per run directory. Torch-free and cheap to import: launchers, the
worker and the report all use it; plugins import it (``olmx.api.PUBLIC_MODULES``) for the names
below.

* :mod:`olmx.rundir.layout`: the files and folders of a run directory (:class:`RunDir`), the
  launch record, the ownership marker, moving old checkpoints aside, :func:`tail`;
* :mod:`olmx.rundir.lock`: the lock (:class:`Holder`, :class:`RunLock`, :data:`LOCK_ENV`);
* :mod:`olmx.rundir.processes`: what the lock asks of this host's processes (``/proc``).
"""

from __future__ import annotations

from olmx.rundir.layout import (
    CHECKPOINT_MARK,
    CHECKPOINTS,
    EVENTS_FILE,
    LAUNCH_FILE,
    LOCK_FILE,
    LOGS,
    MARKER_FILE,
    METRICS_FILE,
    OLD_CHECKPOINTS,
    PLAN_FILE,
    PROFILE,
    REPORT,
    SUMMARY_FILE,
    WORK,
    RunDir,
    tail,
)
from olmx.rundir.lock import LOCK_ENV, Holder, RunLock
from olmx.rundir.processes import process_alive, process_start, process_state, processes_with_env

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "PLAN_FILE",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "EVENTS_FILE",
    "LAUNCH_FILE",
    "CHECKPOINTS",
    "CHECKPOINT_MARK",
    "LOGS",
    "WORK",
    "REPORT",
    "PROFILE",
    "MARKER_FILE",
    "LOCK_FILE",
    "LOCK_ENV",
    "OLD_CHECKPOINTS",
    "RunDir",
    "process_start",
    "process_state",
    "process_alive",
    "processes_with_env",
    "Holder",
    "RunLock",
    "tail",
]
