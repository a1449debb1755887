"""Following a run from the launching terminal: a progress bar drawn from the run's
``metrics.jsonl`` (plain lines when the output is not a terminal) and the exception from the log
when it fails (the end-of-run report is olmx.report)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from olmx.errors import RunFailed
from olmx.plan import Plan
from olmx.rundir import RunDir

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["PLAIN_EVERY_S", "PLAIN_LINES", "follow", "format_progress", "progress_line"]

#: Without a terminal (output to a file or a pipe: nohup, CI, a batch log), a plain progress
#: line is printed every this many seconds (when a step finished since the last line) ...
PLAIN_EVERY_S = 30.0
#: ... and every ``max_steps // PLAIN_LINES`` steps, so a run prints about this many lines.
PLAIN_LINES = 20


def follow(
    plan: Plan,
    poll: Callable[[], int | None],
    *,
    log_path: Path,
    console: Console,
    interval: float = 0.5,
    every_s: float = PLAIN_EVERY_S,
    every_steps: int | None = None,
) -> int:
    """Show progress until ``poll()`` returns an exit code; raise RunFailed on failure. In a
    terminal: a progress bar. Otherwise: a plain line (:func:`format_progress`) every
    ``every_steps`` steps (default ``max_steps // PLAIN_LINES``, at least 1) or ``every_s``
    seconds, whichever comes first, every evaluated step (with its ``eval/loss``), and one for
    the last step seen."""
    metrics = RunDir(plan.run_dir).metrics
    total = plan.run.trainer.max_steps
    if console.is_terminal:
        rc = _follow_bar(plan, poll, metrics, console, interval)
    else:
        rc = _follow_plain(plan, poll, metrics, console, interval, every_s, every_steps or max(1, total // PLAIN_LINES))
    if rc != 0:
        from olmx.launch.failures import log_excerpt

        raise RunFailed(f"training failed with exit code {rc}; from {log_path}:\n{log_excerpt(log_path)}", rc)
    return rc


def _follow_bar(plan: Plan, poll: Callable[[], int | None], metrics: Path, console: Console, interval: float) -> int:
    progress = Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[eval]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        # rich's default 10 redraws/s costs ~3% of a core in a terminal, taken from training
        # on small CPU machines (benchmarks/results/spine.md); metrics arrive at most per step.
        refresh_per_second=2,
    )
    offset = 0
    with progress:
        task = progress.add_task(
            "train", total=plan.run.trainer.max_steps, completed=plan.resume_step or 0, loss="-", eval="", tps="-"
        )
        while True:
            rc = poll()
            records, offset = _new_records(metrics, offset)
            for r in records:
                fields: dict[str, Any] = {}
                if r.get("loss") is not None:
                    fields["loss"] = f"{r['loss']:.3f}"
                if r.get("eval/loss") is not None:
                    fields["eval"] = f"eval {r['eval/loss']:.3f}"
                if r.get("tokens_per_s"):
                    fields["tps"] = f"{r['tokens_per_s']:,.0f}"
                progress.update(task, completed=r["step"], **fields)
            if rc is not None:
                return rc
            time.sleep(interval)


def _follow_plain(
    plan: Plan,
    poll: Callable[[], int | None],
    metrics: Path,
    console: Console,
    interval: float,
    every_s: float,
    every_steps: int,
) -> int:
    total = plan.run.trainer.max_steps
    offset, last, shown = 0, None, plan.resume_step or 0
    first: tuple[float, int] | None = None  # (time, step) of the first record seen
    printed_at = time.monotonic()
    while True:
        rc = poll()
        records, offset = _new_records(metrics, offset)
        for r in records:
            if first is None:
                first = (time.monotonic(), r["step"])
            last = r
            due = r["step"] - shown >= every_steps or time.monotonic() - printed_at >= every_s
            due = due or r.get("eval/loss") is not None  # every evaluation is shown
            if due or r["step"] >= total:
                console.print(format_progress(r, total, first), markup=False, highlight=False)
                shown, printed_at = r["step"], time.monotonic()
        if rc is not None:
            if last is not None and last["step"] != shown:
                console.print(format_progress(last, total, first), markup=False, highlight=False)
            return rc
        time.sleep(interval)


def format_progress(record: dict[str, Any], total: int, first: tuple[float, int] | None = None) -> str:
    """'step 40/200 (20%), loss 3.912, 12,345 tok/s, ETA 0:02:10' (an evaluated step adds 'eval
    loss 3.950 (perplexity 51.94)' after the loss): one metrics record as a
    plain line (``first``: the time and step this follower started from, for the ETA)."""
    step = record["step"]
    parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)"]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.3f}")
    if record.get("eval/loss") is not None:
        parts.append(f"eval loss {record['eval/loss']:.3f} (perplexity {record['eval/perplexity']:.2f})")
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if first is not None and step > first[1]:
        rate = (time.monotonic() - first[0]) / (step - first[1])
        left = int(rate * max(total - step, 0))
        parts.append(f"ETA {left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}")
    return ", ".join(parts)


def _new_records(metrics: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete records appended to ``metrics.jsonl`` since byte ``offset``, and the new offset."""
    if not metrics.exists():
        return [], offset
    with open(metrics, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    out = []
    for line in complete.decode(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "step" in r:
            out.append(r)
    return out, offset + len(complete)


def progress_line(plan: Plan) -> str:
    """The last record of the run's ``metrics.jsonl`` as one line (for ``olmx jobs status``)."""
    path = RunDir(plan.run_dir).metrics
    total = plan.run.trainer.max_steps
    last = None
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                last = json.loads(line)
            except ValueError:
                continue
    if last is None:
        return f"progress: no step finished yet (of {total})"
    loss = f", loss {last['loss']:.4f}" if last.get("loss") is not None else ""
    return f"progress: step {last['step']}/{total}{loss}"
