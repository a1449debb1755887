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

from olmx.events import EXIT_HANG, EXIT_NONFINITE, EXIT_PREEMPTED
from olmx.rundir import tail as read_tail

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "FAILED_LINE",
    "PEER_LOST",
    "RankFailure",
    "signal_cause",
    "TRACEBACK",
    "exception_excerpt",
    "log_excerpt",
    "rank_excerpt",
    "latest_torchrun_dir",
    "attempt_failures",
    "FailureRecorder",
    "PLANNED_EXITS",
]

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


#: The first line of a Python traceback.
TRACEBACK = "Traceback (most recent call last):"
#: Bytes of a log read from its end to look for the exception in.
_SCAN_BYTES = 1 << 20


def exception_excerpt(text: str, lines: int = 30) -> str | None:
    """The last Python traceback in ``text`` (with the tracebacks it is chained to), ending at
    its exception line; None if there is none. Lines of other processes interleaved with it
    (without the traceback's prefix, such as torchrun's ``[rank1]:``) are left out; a long one
    keeps its first and last lines, ``lines`` in all."""
    all_lines = text.splitlines()
    starts = [i for i, line in enumerate(all_lines) if TRACEBACK in line]
    if not starts:
        return None
    first = last = starts[-1]
    prefix = all_lines[last][: all_lines[last].index(TRACEBACK)]
    for earlier in reversed(starts[:-1]):  # "During handling of the above exception ...", "... direct cause ..."
        between = " ".join(all_lines[earlier:first])
        if all_lines[earlier].startswith(prefix) and ("above exception" in between):
            first = earlier
        else:
            break
    block = [all_lines[first]]
    for i in range(first + 1, len(all_lines)):
        line = all_lines[i]
        if not line.startswith(prefix):
            continue  # another process's output, interleaved
        block.append(line)
        body = line[len(prefix) :]
        if i > last and body and not body[0].isspace():
            break  # the exception line of the last traceback
    if len(block) > lines:
        head = max(1, lines // 3)
        block = block[:head] + ["  ..."] + block[len(block) - (lines - head - 1) :]
    return "\n".join(block)


def _read_end(path: Path, since: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(since, size - _SCAN_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_excerpt(path: str | Path, *, since: int = 0, lines: int = 30) -> str:
    """What to quote of a log (from byte ``since`` on) when a run failed: its last traceback,
    else its last ``lines`` lines."""
    text = _read_end(Path(path), since)
    found = exception_excerpt(text, lines)
    if found is not None:
        return found
    return "\n".join(text.splitlines()[-lines:])


def rank_excerpt(rank_dir: Path, lines: int = 30) -> tuple[Path, str]:
    """The log of a rank that holds its exception (``stderr.log`` or ``stdout.log``, whichever
    has a traceback) and the lines to quote from it; without a traceback, the end of
    ``stderr.log`` (or of ``stdout.log`` when that is empty)."""
    for name in ("stderr.log", "stdout.log"):
        found = exception_excerpt(_read_end(rank_dir / name), lines)
        if found is not None:
            return rank_dir / name, found
    for name in ("stderr.log", "stdout.log"):
        tail = read_tail(rank_dir / name, lines)
        if tail:
            return rank_dir / name, tail
    return rank_dir / "stderr.log", ""


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
            log, tail = rank_excerpt(rank_dir, lines)
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


#: Worker exit codes of a run that stopped itself (:mod:`olmx.events`: 75 stopped with a
#: checkpoint, including a full disk; 76 a non-finite stop; 77 the hang watchdog's verdict).
PLANNED_EXITS = (EXIT_PREEMPTED, EXIT_NONFINITE, EXIT_HANG)


class FailureRecorder:
    """Records every failed attempt of one torchrun launch in ``events.jsonl`` (``rank_failed``)
    as soon as torchrun reports it in the node log, not only when the launch ends: the cause of
    an elastic restart is kept even if the launcher is killed later. Call :meth:`poll` while
    following the launch and once when it has ended.

    An attempt whose first rank to end exited with one of :data:`PLANNED_EXITS` is not a rank
    failure: the run stopped itself (its ``end`` or ``hang`` record says why and names the
    ranks), and torchrun's line names only the rank that happened to exit first."""

    def __init__(
        self, run_dir: str | Path, log_path: Path, *, offset: int, since: float, node_rank: int, launch: str
    ) -> None:
        self.run_dir, self.log_path = Path(run_dir), log_path
        self.pos, self.since, self.node_rank, self.launch = offset, since, node_rank, launch
        self.failed_lines = ""  # torchrun's "failed (exitcode ...)" lines of this launch
        self.failures: list[RankFailure] = []

    def poll(self) -> list[RankFailure]:
        """Read what the log gained, record new failures; all of this launch's failures so far."""
        from olmx.events import append_event
        from olmx.rundir import RunDir

        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return self.failures
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.pos += len(complete)
        found = [line for line in complete.decode(errors="replace").splitlines() if FAILED_LINE.search(line)]
        if not found:
            return self.failures
        self.failed_lines += "".join(f"{line}\n" for line in found)
        failures = attempt_failures(
            self.failed_lines,
            latest_torchrun_dir(RunDir(self.run_dir).torchrun_logs, since=self.since),
            node_rank=self.node_rank,
        )
        failures = [f for f in failures if f.exitcode not in PLANNED_EXITS]
        for failure in failures[len(self.failures) :]:
            append_event(self.run_dir, "rank_failed", launch=self.launch, **failure.as_event())
        self.failures = failures
        return failures
