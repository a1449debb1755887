"""The run's event log, ``RUN_DIR/events.jsonl``, and the exit codes of a stopped run.

What happened to a run, beyond its per-step metrics, is appended here as one JSON object per
line: every start of the worker group (``start``, with the torchrun ``attempt`` and the step it
resumed from), checkpoints found partial or corrupt at resume (``checkpoint_partial``,
``checkpoint_corrupt``), non-finite steps (``nonfinite``), how the processes ended (``end``,
``reason``: ``max_steps``, ``stop_at_step``, a signal name or ``nonfinite``, with the step whose
checkpoint was saved; ``nospace``: a checkpoint could not be written, ``step`` the newest intact
one), hangs the watchdog found (``hang``: the step, the culprit ``ranks``, the
``collective`` the others waited in, a ``summary`` line, the ``folder`` with every rank's
stack), a ``trainer.resume=false`` start (``fresh``, ``moved_to``: where the
earlier checkpoints were moved aside, or null), and the rank failures the
launcher read from torchrun (``rank_failed``). The launcher, ``olmx
report`` and a requeueing batch script read it; nothing here imports torch.

A ``nonfinite`` record (``step``, ``action``: ``skip`` or ``stop``) and a ``spike`` record (a
loss beyond ``trainer.spike_zscore``: ``step``, ``loss``, the recent ``mean`` and ``std``,
``zscore``) also carry the step's diagnosis (:mod:`olmx.worker.diagnosis`): ``verdict``
(``data``: the failing micro-batches fail again when replayed on another rank; ``numerics``:
they do not, or every rank failed on its own data, or only the gradients did; ``this rank``:
one rank alone failed and its micro-batches are fine on another), ``ranks`` (those whose own
loss went non-finite, or spiked), ``module`` (the first module whose output was non-finite in
their replay, e.g. ``embeddings``; null if none), ``reason`` (one line), ``failing_documents``
(``[token file, token offset]`` of the sequences whose output was non-finite there), and ``by_rank``: per
rank its ``loss`` (its own, null if non-finite), ``documents`` (``[token file, token offset]``
of each sequence of its batch), ``replay`` (its micro-batches replayed on itself: ``module``,
``sequences``: positions in ``documents`` whose output was non-finite there, ``loss``, ``bad``),
``replayed_other`` (the previous data-parallel rank's micro-batches replayed on it, with that
``dp_rank``) and ``error`` where a part could not run.

Each record carries ``time`` and, when the launcher set ``OLMX_LAUNCH_ID`` in the environment
of torchrun, ``launch``: the outcome of one launch is read from that launch's records only.
Only rank 0 (or the launcher) writes, except a ``hang``, written by the first live rank to
reach the verdict; records are single short ``write`` calls in append mode.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmx.rundir import RunDir

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "LAUNCH_ENV",
    "LAUNCH_TIME_ENV",
    "EXIT_PREEMPTED",
    "EXIT_NONFINITE",
    "EXIT_HANG",
    "hang_message",
    "diagnosis_line",
    "append_event",
    "read_events",
    "Outcome",
    "outcome",
]

#: Environment variable naming the launch whose processes write events.
LAUNCH_ENV = "OLMX_LAUNCH_ID"
#: Environment variable holding the launch's start (Unix time), where the launcher sets it:
#: the start-up the goodput accounts counts from there (:mod:`olmx.goodput`).
LAUNCH_TIME_ENV = "OLMX_LAUNCH_TIME"

#: Exit code of a run stopped by SIGTERM/SIGINT after saving a checkpoint: rerun the same
#: ``olmx train`` (same run directory) to resume. ``EX_TEMPFAIL`` of sysexits.h.
EXIT_PREEMPTED = 75
#: Exit code of a run stopped on a non-finite loss or gradient (``trainer.on_nonfinite=stop``)
#: after saving a checkpoint of the last good parameters.
EXIT_NONFINITE = 76
#: Exit code of a run whose ranks made no progress for ``trainer.hang_timeout`` (the hang
#: watchdog ended them, :mod:`olmx.worker.watchdog`): the ``hang`` event names the ranks.
EXIT_HANG = 77


def append_event(run_dir: str | Path, event: str, **fields: Any) -> dict[str, Any]:
    """Append one record (``event`` plus ``fields``, ``time`` and ``launch``) and return it."""
    record: dict[str, Any] = {"event": event, "time": round(time.time(), 3)}
    launch = os.environ.get(LAUNCH_ENV)
    if launch:
        record["launch"] = launch
    record.update(fields)
    path = RunDir(run_dir).events
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as f:
        torn = f.seek(0, os.SEEK_END) > 0 and f.seek(-1, os.SEEK_END) >= 0 and f.read(1) != b"\n"
        f.write((("\n" if torn else "") + json.dumps(record) + "\n").encode())  # a torn line stays alone
    return record


def read_events(run_dir: str | Path, *, launch: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
    """The records of the run (of one launch if ``launch`` is given, written at or after the
    Unix time ``since`` if given); a torn last line is skipped."""
    path = RunDir(run_dir).events
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (launch is None or record.get("launch") == launch) and (since is None or record.get("time", 0) >= since):
            out.append(record)
    return out


@dataclass(frozen=True)
class Outcome:
    """How a launch ended, as its events tell it."""

    #: ``complete``, ``stopped`` (signal), ``nonfinite`` (stopped on a non-finite loss),
    #: ``hang`` (the hang watchdog ended the ranks) or ``failed`` (no final record: the
    #: processes died or raised).
    state: str
    #: The exit code ``olmx train`` should end with.
    exit_code: int
    #: Step of the last checkpoint written, where known.
    step: int | None
    #: One line for the user.
    message: str


def outcome(
    run_dir: str | Path, *, launch: str | None = None, since: float | None = None, returncode: int | None = None
) -> Outcome:
    """The outcome of a launch from its last ``end`` record (``since``: as in
    :func:`read_events`; ``returncode``: torchrun's, used when there is none)."""
    final = None
    for record in read_events(run_dir, launch=launch, since=since):
        if record["event"] in ("end", "hang"):
            final = record
        elif record["event"] == "start":
            final = None  # a later attempt started: only its own end counts
    if final is None:
        return Outcome("failed", returncode or 1, None, "the processes ended without a final record")
    if final["event"] == "hang":
        return Outcome("hang", EXIT_HANG, None, hang_message(final))
    step, reason = final.get("step"), final.get("reason")
    if reason == "max_steps":
        return Outcome("complete", 0, step, f"finished at step {step}")
    if reason == "stop_at_step":
        return Outcome("complete", 0, step, f"stopped at trainer.stop_at_step={step}")
    if reason == "nonfinite":
        records = read_events(run_dir, launch=launch, since=since)
        diagnosed = [r for r in records if r["event"] == "nonfinite" and r.get("step") == step]
        line = diagnosis_line(diagnosed[-1]) if diagnosed else ""
        verdict = diagnosed[-1].get("verdict") if diagnosed else None
        return Outcome(
            "nonfinite",
            EXIT_NONFINITE,
            step,
            f"stopped on a non-finite loss/gradient at step {step}; the checkpoint of step {step} holds "
            f"the parameters from before that step" + (f"; {line}" if line else "") + f"; {NONFINITE_ADVICE[verdict]}",
        )
    if reason == "nospace":  # a checkpoint could not be written (olmx.worker.run): resume once there is space
        kept = f"the checkpoint of step {step} is intact" if step else "there is no earlier checkpoint"
        return Outcome(
            "stopped",
            EXIT_PREEMPTED,
            step,
            f"checkpoint step {final.get('failed_step')} could not be written: {final.get('error')} "
            f"({final.get('folder')}); {kept}; free some space first",
        )
    if not step:  # stopped before the first step of a fresh run: nothing saved; rerun starts afresh
        return Outcome(
            "stopped",
            EXIT_PREEMPTED,
            step,
            f"stopped by {reason} before the first step; no checkpoint was saved (the next olmx train starts afresh)",
        )
    return Outcome("stopped", EXIT_PREEMPTED, step, f"stopped by {reason}; checkpoint saved at step {step}")


#: What to do about a non-finite stop, by the diagnosis' verdict (None: not diagnosed).
NONFINITE_ADVICE: dict[str | None, str] = {
    "data": "the failing documents (events.jsonl, failing_documents) break the model wherever they "
    "go: drop them from data.paths, or set trainer.on_nonfinite=skip",
    "this rank": "one rank failed on data that is fine elsewhere: suspect its device or node, and resume on other ones",
    "numerics": "lower the learning rate (or set trainer.on_nonfinite=skip)",
    None: "lower the learning rate (or set trainer.on_nonfinite=skip)",
}


def diagnosis_line(record: dict[str, Any]) -> str:
    """One line for a diagnosed ``nonfinite`` or ``spike`` record ("" if it has no verdict)."""
    if "verdict" not in record:
        return ""
    module = f"; first non-finite output: {record['module']}" if record.get("module") else ""
    return f"verdict: {record['verdict']} ({record.get('reason')}){module}"


def hang_message(record: dict[str, Any]) -> str:
    """One line for a ``hang`` record: the step, who stopped or spins, where the stacks are."""
    return (
        f"hang at step {record.get('step')}: no progress for {record.get('timeout'):g} s "
        f"(trainer.hang_timeout); {record.get('summary')}; every rank's stack in {record.get('folder')}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m olmx.events RUN_DIR [LAUNCH_ID]``: print a run's (or launch's) outcome and
    exit with its code (0 complete, 75 preempted with a checkpoint, 76 non-finite stop, 77
    hang, 1 failed): what a batch script checks before it requeues a job."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    result = outcome(args[0], launch=args[1] if len(args) > 1 else None)
    print(f"{result.state}: {result.message}")
    return result.exit_code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
