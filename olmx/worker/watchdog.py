"""The hang watchdog: a rank that stops making progress is found, named and ended.

A rank that stops (a wedged GPU process, a stopped or swapped-out process, a deadlock in
Python) leaves every other rank waiting in a collective until gloo's or NCCL's timeout, with
nothing said. With ``trainer.hang_timeout`` (the plan's :attr:`olmx.plan.execution.Execution.hang_timeout`)
every rank runs a daemon thread, :class:`Watchdog`:

1. **Progress.** The Trainer's hooks (:class:`HangWatch`: a step begins, its backward ends, it
   ends, a checkpoint is saved) record the rank's step and phase in memory; at most every
   ``timeout / 10`` seconds the rank also writes them, with its host and pid, to
   ``RUN_DIR/hang/attempt<A>/rank<R>.beat.json`` (the last heartbeat the verdict quotes). The
   watch is armed after the attempt's first step (compilation and start-up are not timed;
   the process group's own timeout, set above the watchdog's, covers them).
2. **Detection.** When the rank has made no progress for ``timeout`` seconds, its thread writes
   ``rank<R>.report.json``: the main thread's Python stack (the thread runs while the main
   thread waits in a collective, which releases the GIL, or spins in Python, which yields it),
   whether that stack is inside torch (waiting in a collective, the backward pass or a kernel)
   or in Python code, and, on CUDA, the NCCL Flight Recorder's trace (``rank<R>.fr_trace``).
3. **Verdict.** Each reporting rank waits up to a grace period for the others' reports; the
   first to finish writes ``verdict.json`` (an atomic link: one writer). A rank with no report
   is *stopped* (its process state from ``/proc`` where it shares the host: ``T`` stopped by a
   signal, ``D`` wedged in the kernel or a driver); a rank whose stack is in Python code
   *spins* there; the others *wait* (the collective they wait in is named from their stacks).
   Its writer appends a ``hang`` event to ``events.jsonl`` (the step, the culprit ranks, the
   collective, one line for the user).
4. **End.** Every live rank SIGKILLs the culprits that share its host and exits with
   :data:`olmx.events.EXIT_HANG`; torchrun then ends the group and, within
   ``infra.max_restarts``, restarts it from the newest checkpoint that verifies. Without
   restarts ``olmx train`` exits with that code and the verdict's line.

Torch is imported only for the Flight Recorder dump (CUDA).
"""

from __future__ import annotations

import errno
import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from olmo_core.train.callbacks import Callback

from olmx.events import EXIT_HANG, append_event
from olmx.rundir import RunDir, process_state
from olmx.writable import write_text_atomic

log = logging.getLogger(__name__)

#: Process states of ``/proc/PID/stat`` a hang verdict names.
PROCESS_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep (wedged in the kernel or a driver)",
    "T": "stopped by a signal",
    "t": "stopped by a debugger",
    "Z": "a zombie (exited, not reaped)",
}


def attempt_dir(run_dir: str | Path, attempt: int) -> Path:
    """``RUN_DIR/hang/attempt<A>``: the watchdog's files of one torchrun attempt."""
    return RunDir(run_dir).hang / f"attempt{attempt}"


def main_stack() -> list[dict[str, Any]]:
    """The main thread's Python stack, outermost first: ``file``, ``line``, ``function``."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    stack = []
    while frame is not None:
        stack.append({"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name})
        frame = frame.f_back
    return stack[::-1]


def _in_torch(path: str) -> bool:
    return f"{os.sep}torch{os.sep}" in path


def classify(stack: list[dict[str, Any]]) -> tuple[str, str]:
    """Where a rank's main thread is: ``("waits", what)`` inside torch (``what``: the
    ``torch.distributed`` function it is in, else the backward pass or the torch function), or
    ``("spins", "file:line in function")`` in Python code outside torch."""
    if not stack:
        return "spins", "no Python frame"
    inner = stack[-1]
    if not _in_torch(inner["file"]):
        return "spins", f"{inner['file']}:{inner['line']} in {inner['function']}"
    for frame in reversed(stack):
        if f"{os.sep}torch{os.sep}distributed{os.sep}" in frame["file"]:
            return "waits", frame["function"]
    if any(f"{os.sep}torch{os.sep}autograd{os.sep}" in f["file"] for f in stack):
        return "waits", "the backward pass (its gradient reductions)"
    return "waits", inner["function"]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def verdict(reports: dict[int, dict[str, Any]], beats: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """The verdict over every rank's report (``reports``: by rank, those that came) and last
    heartbeat (``beats``): each rank's state, the culprits and one line for the user."""
    host, now = socket.gethostname(), time.time()
    ranks: list[dict[str, Any]] = []
    stopped: list[dict[str, Any]] = []
    spinning: list[dict[str, Any]] = []
    waits: dict[str, list[int]] = {}
    for rank in range(world_size):
        beat = beats.get(rank, {})
        entry: dict[str, Any] = {"rank": rank, "host": beat.get("host"), "pid": beat.get("pid")}
        entry["last_step"] = beat.get("step")
        entry["last_beat_s_ago"] = round(now - beat["time"], 1) if "time" in beat else None
        if beat.get("host") == host and beat.get("pid"):
            letter = process_state(int(beat["pid"]))
            entry["state"] = "gone" if letter is None else PROCESS_STATES.get(letter, letter)
        report = reports.get(rank)
        if report is None:
            entry["verdict"] = "stopped"
            stopped.append(entry)
        else:
            entry["verdict"], entry["at"] = report["where"], report["at"]
            entry["step"] = report.get("step")
            if report["where"] == "spins":
                spinning.append(entry)
            else:
                waits.setdefault(report["at"], []).append(rank)
        ranks.append(entry)
    culprits = stopped + spinning
    parts = []
    for e in stopped:
        if e.get("state"):
            how = f"process {e['state']}"
        else:
            how = f"on host {e['host']}" if e.get("host") else "no heartbeat"
        if e.get("last_beat_s_ago") is not None:
            how += f"; last heartbeat {e['last_beat_s_ago']:g} s ago, at step {e['last_step']}"
        parts.append(f"rank {e['rank']} stopped responding ({how})")
    for e in spinning:
        parts.append(f"rank {e['rank']} spins in Python at {e['at']}")
    collective = max(waits, key=lambda k: len(waits[k])) if waits else None
    for at, who in waits.items():
        parts.append(f"{_ranks(who)} wait{'s' if len(who) == 1 else ''} in {at}")
    if not culprits:
        parts.insert(0, "no rank is outside torch: every rank waits (ranks in different collectives, or a lost link)")
    step = max((e.get("step") or e.get("last_step") or 0 for e in ranks), default=0)
    return {
        "step": step,
        "ranks": [e["rank"] for e in culprits] or list(range(world_size)),
        "collective": collective,
        "summary": "; ".join(parts),
        "per_rank": ranks,
    }


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


@dataclass
class Watchdog:
    """One rank's hang watchdog (module doc). :meth:`start` it once the process group is up."""

    run_dir: str
    rank: int
    world_size: int
    #: Seconds without progress that count as a hang.
    timeout: float
    attempt: int = 0
    device: str = "cpu"
    step: int = 0
    phase: str = "start-up"
    armed: bool = False
    _progress: float = field(default_factory=time.monotonic)
    _written: float = 0.0
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def folder(self) -> Path:
        """This attempt's folder (:func:`attempt_dir`)."""
        return attempt_dir(self.run_dir, self.attempt)

    def start(self) -> None:
        """Write the first heartbeat and start the thread."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._beat_file(force=True)
        self._thread = threading.Thread(target=self._loop, name="olmx-hang-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int, phase: str, *, arm: bool = False) -> None:
        """Progress: the rank reached ``phase`` of ``step`` (``arm``: start timing)."""
        self.step, self.phase, self._progress = step, phase, time.monotonic()
        self.armed = self.armed or arm
        self._beat_file()

    def disarm(self) -> None:
        """Stop timing (training is over: what follows waits on purpose)."""
        self.armed = False

    def _beat_file(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < self.timeout / 10:
            return
        self._written = now
        record = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid()}
        record.update(step=self.step, phase=self.phase, time=time.time())
        try:
            write_text_atomic(self.folder / f"rank{self.rank}.beat.json", json.dumps(record, default=str))
        except OSError:
            pass  # a full disk must not end the rank from here

    def _loop(self) -> None:
        poll = min(5.0, max(0.2, self.timeout / 20))
        while True:
            time.sleep(poll)
            if self.armed and time.monotonic() - self._progress > self.timeout:
                self._fire()
                return

    def _fire(self) -> None:
        """No progress for ``timeout``: report, agree on the verdict, end (module doc)."""
        stack = main_stack()
        where, at = classify(stack)
        since = round(time.monotonic() - self._progress, 1)
        report = {"rank": self.rank, "step": self.step, "phase": self.phase, "where": where, "at": at}
        report.update(no_progress_s=since, stack=stack, host=socket.gethostname(), pid=os.getpid())
        self._beat_file(force=True)
        try:
            with open(self.folder / f"rank{self.rank}.stack.txt", "w") as f:
                faulthandler.dump_traceback(f, all_threads=True)
            self._flight_recorder()
            write_text_atomic(self.folder / f"rank{self.rank}.report.json", json.dumps(report, default=str))
        except OSError as e:
            log.error(f"hang watchdog: could not write its report ({e})")
        log.error(f"hang: rank {self.rank} made no progress for {since} s at step {self.step} ({self.phase}); {at}")
        grace = min(30.0, max(2.0, self.timeout / 4))
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and len(self._gather("report")) < self.world_size:
            time.sleep(0.2)
        found = self._agree()
        if found is not None:
            self._end_culprits(found)
        logging.shutdown()
        os._exit(EXIT_HANG)

    def _gather(self, kind: str) -> dict[int, dict[str, Any]]:
        out = {}
        for rank in range(self.world_size):
            record = _read_json(self.folder / f"rank{rank}.{kind}.json")
            if record is not None:
                out[rank] = record
        return out

    def _agree(self) -> dict[str, Any] | None:
        """Write the verdict if no rank has yet (one writer, by an atomic link), else read it."""
        path = self.folder / "verdict.json"
        found = verdict(self._gather("report"), self._gather("beat"), self.world_size)
        found.update(timeout=self.timeout, attempt=self.attempt, folder=str(self.folder))
        tmp = path.with_name(f".verdict.{self.rank}")
        try:
            tmp.write_text(json.dumps(found, default=str))
            os.link(tmp, path)
        except FileExistsError:
            return _read_json(path)
        except OSError as e:
            if e.errno != errno.EEXIST:
                log.error(f"hang watchdog: could not write the verdict ({e})")
            return found
        finally:
            tmp.unlink(missing_ok=True)
        fields = {k: found[k] for k in ("step", "ranks", "collective", "summary", "timeout", "attempt", "folder")}
        append_event(self.run_dir, "hang", **fields)
        log.error(f"hang at step {found['step']}: {found['summary']}")
        return found

    def _flight_recorder(self) -> None:
        """On CUDA: the NCCL Flight Recorder's record of this rank's collectives."""
        if self.device != "cuda":
            return
        try:
            import torch

            c10d = torch._C._distributed_c10d
            dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
            if dump is not None:
                (self.folder / f"rank{self.rank}.fr_trace").write_bytes(dump())
        except Exception as e:  # a diagnostic: the verdict goes on without it
            log.warning(f"hang watchdog: no Flight Recorder dump ({e})")

    def _end_culprits(self, found: dict[str, Any]) -> None:
        """SIGKILL the culprit ranks that share this host (a stopped process ignores SIGTERM)."""
        import signal

        host = socket.gethostname()
        for entry in found.get("per_rank", []):
            if entry["rank"] in found["ranks"] and entry["rank"] != self.rank and entry.get("host") == host:
                if entry.get("verdict") in ("stopped", "spins") and entry.get("pid"):
                    try:
                        os.kill(int(entry["pid"]), signal.SIGKILL)
                    except OSError:
                        pass


@dataclass
class HangWatch(Callback):
    """The Trainer's progress, reported to the rank's :class:`Watchdog`."""

    #: After every other callback's hooks: an evaluation in ``post_step`` counts to its step.
    priority: ClassVar[int] = -1000
    watchdog: Watchdog | None = None

    def pre_step(self, batch: dict[str, Any]) -> None:
        """A step begins."""
        if self.watchdog:
            self.watchdog.beat(self.step, "forward, backward, gradient checks")

    def pre_optim_step(self) -> None:
        """Its backward pass ended."""
        if self.watchdog:
            self.watchdog.beat(self.step, "optimizer step")

    def post_step(self) -> None:
        """It ended (with its evaluation): the watch is armed from here on."""
        if self.watchdog:
            self.watchdog.beat(self.step, "between steps", arm=True)

    def post_checkpoint_saved(self, path: Any) -> None:
        """A checkpoint was saved."""
        if self.watchdog:
            self.watchdog.beat(self.step, "checkpoint saved")

    def post_train(self) -> None:
        """Training ended: what follows (the final save, the summary) is not timed."""
        if self.watchdog:
            self.watchdog.disarm()


def hang_callbacks(run_dir: str, timeout: int, device: str, attempt: int) -> dict[str, Callback]:
    """The watchdog's callback, its thread started (none when ``timeout`` is 0)."""
    if not timeout:
        return {}
    from olmo_core.distributed.utils import get_rank, get_world_size

    dog = Watchdog(run_dir, get_rank(), get_world_size(), float(timeout), attempt=attempt, device=device)
    dog.start()
    return {"olmx_hang": HangWatch(watchdog=dog)}
