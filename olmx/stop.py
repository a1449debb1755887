"""Stop requests: SIGTERM/SIGINT/SIGHUP handlers that only set a flag (no torch here, so the
worker installs them before its slow imports and a preemption notice during start-up is kept),
and the parent-death signal that turns the death of a process's parent into such a stop.

SIGHUP (a closed terminal, a dropped SSH session; torchrun passes it on to its workers) stops
a run like SIGTERM: the step is finished, a checkpoint saved, exit code 75.

:class:`olmx.worker.faults.TrainingGuard` turns the flag into a stop agreed by every rank.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

log = logging.getLogger(__name__)

#: Signals that stop a run with a checkpoint.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: ``prctl`` option: the signal a process gets when the thread that started it ends (Linux).
PR_SET_PDEATHSIG = 1

_requested: int = 0  # the first stop signal received (0: none)


def _on_signal(signum: int, frame: Any) -> None:
    global _requested
    if not _requested:
        _requested = signum
        log.warning(f"{signal.Signals(signum).name} received: finishing this step, then saving a checkpoint")


def install_stop_handlers() -> None:
    """Make SIGTERM/SIGINT/SIGHUP only request a stop; call from the main thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)


def request_stop(signum: int) -> None:
    """Record a stop request as if ``signum`` had arrived (first request wins)."""
    global _requested
    _requested = _requested or signum


def stop_requested() -> int:
    """The stop signal this process received (0: none)."""
    return _requested


def die_with_parent(signum: int = signal.SIGTERM, *, parent: int | None = None) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``; the parent must be the main thread of its process, as
    torchrun's and olmx's launchers are). ``parent``: the pid expected as parent (default: the
    current one); if it is already gone, ``signum`` is sent now. Returns False where the
    platform has no such call (then nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    expected = os.getppid() if parent is None else parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected:  # the parent died before the call
        os.kill(os.getpid(), signum)
    return True
