"""Stop requests: SIGTERM/SIGINT handlers that only set a flag (no torch here, so the worker
installs them before its slow imports and a preemption notice during start-up is kept).

:class:`olmx.worker.faults.TrainingGuard` turns the flag into a stop agreed by every rank.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

log = logging.getLogger(__name__)

#: Signals that stop a run with a checkpoint.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested: int = 0  # the first stop signal received (0: none)


def _on_signal(signum: int, frame: Any) -> None:
    global _requested
    if not _requested:
        _requested = signum
        log.warning(f"{signal.Signals(signum).name} received: finishing this step, then saving a checkpoint")


def install_stop_handlers() -> None:
    """Make SIGTERM/SIGINT only request a stop; call from the main thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)


def request_stop(signum: int) -> None:
    """Record a stop request as if ``signum`` had arrived (first request wins)."""
    global _requested
    _requested = _requested or signum


def stop_requested() -> int:
    """The stop signal this process received (0: none)."""
    return _requested
