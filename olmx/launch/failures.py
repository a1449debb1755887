"""Which rank died, and why, from torchrun's own records (no torch import).

torchrun (started with ``--log-dir DIR --tee 3``) keeps, for every attempt of the worker group,
``DIR/<run id>_<random>/attempt_<k>/<local rank>/{stdout,stderr}.log`` and, for a rank whose
Python raised under ``torch.distributed.elastic``'s ``record`` (olmx's worker does), an
``error.json`` with the exception and its traceback. For every failed attempt its agent logs
one line ``failed (exitcode: X) local_rank: R (pid: P) of binary: ...``: its choice of the first
failure.

That choice orders failures by error-file timestamps in whole seconds, so when one rank is
killed (no error file) and its peer raises in the same second because a collective lost its
partner, torchrun may name the peer. :func:`attempt_failures` corrects this: a rank that left
no error file although torchrun did not start the teardown for it (it was killed, or crashed
hard) is the root cause over ranks whose error is a lost-peer error of the collective library.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from olmx.rundir import tail as read_tail

#: torchrun's per-attempt failure line (torch/distributed/elastic/multiprocessing/api.py).
FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of binary")
#: Messages of gloo/NCCL when the other side of a collective went away.
PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"remote process exited|NCCL communicator was aborted|"
    r"ProcessGroupGloo.*(?:timed out|Timed out)|Socket Timeout",
    re.I,
)


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure in one attempt of the worker group."""

    attempt: int
    node_rank: int
    local_rank: int
    #: Process exit code as torchrun saw it (negative: killed by that signal); None if unknown.
    exitcode: int | None
    #: The exception from ``error.json``, or what torchrun knows (a signal), in one line.
    cause: str
    #: The rank's log file (``stderr.log``) if torchrun kept one.
    log: str | None
    #: The last lines of the rank's output.
    tail: str

    def describe(self) -> str:
        """One line: which rank, how it ended."""
        return f"node {self.node_rank} local rank {self.local_rank} (attempt {self.attempt}): {self.cause}"

    def as_event(self) -> dict[str, object]:
        """Fields of a ``rank_failed`` record in ``events.jsonl``."""
        return asdict(self)


def signal_cause(exitcode: int | None) -> str:
    """'killed by SIGKILL (exit code -9)' or 'exited with code 1'."""
    if exitcode is None:
        return "ended without an exit code torchrun reported"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def _error(rank_dir: Path) -> str | None:
    """The exception a rank recorded in torchrun's error file, one line (None: no file)."""
    path = rank_dir / "error.json"
    if not path.is_file():
        return None
    try:
        message = json.loads(path.read_text()).get("message", {})
    except ValueError:
        return "unreadable error.json"
    if isinstance(message, dict):
        message = message.get("message", "")
    return " ".join(str(message).split())[:500]


def latest_torchrun_dir(log_root: Path, *, since: float = 0.0) -> Path | None:
    """The newest torchrun run folder under ``log_root`` created at or after ``since``."""
    if not log_root.is_dir():
        return None
    dirs = [p for p in log_root.iterdir() if p.is_dir() and p.stat().st_mtime >= since - 1]
    return max(dirs, key=lambda p: p.stat().st_mtime) if dirs else None


def attempt_failures(console: str, run_dir: Path | None, *, node_rank: int = 0, lines: int = 30) -> list[RankFailure]:
    """The root-cause failure of every failed attempt, in order, from torchrun's console output
    (``console``: this launch's part of it) and its run folder ``run_dir``."""
    out = []
    for attempt, m in enumerate(FAILED_LINE.finditer(console)):
        exitcode: int | None = int(m.group(1))
        local_rank = int(m.group(2))
        adir = run_dir / f"attempt_{attempt}" if run_dir else None
        ranks = sorted((int(p.name), p) for p in adir.iterdir() if p.name.isdigit()) if adir and adir.is_dir() else []
        errors = {r: _error(p) for r, p in ranks}
        named = errors.get(local_rank)
        if named is not None and PEER_LOST.search(named):
            silent = [r for r, e in errors.items() if e is None and r != local_rank]
            if silent:  # torchrun named a rank that only lost its peer; the silent one died first
                local_rank, exitcode = silent[0], None
        rank_dir = dict(ranks).get(local_rank)
        err = errors.get(local_rank)
        if err is not None:
            cause = f"raised {err}"
        elif exitcode is None:
            cause = "died without a Python error (killed by a signal, or crashed hard)"
        else:
            cause = signal_cause(exitcode)
        log = rank_dir / "stderr.log" if rank_dir else None
        tail = ""
        if rank_dir:
            tail = read_tail(rank_dir / "stderr.log", lines) or read_tail(rank_dir / "stdout.log", lines)
        out.append(
            RankFailure(
                attempt=attempt,
                node_rank=node_rank,
                local_rank=local_rank,
                exitcode=exitcode,
                cause=cause,
                log=str(log) if log else None,
                tail=tail,
            )
        )
    return out
