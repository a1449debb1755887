"""Following a run from the launching terminal: a progress bar drawn from the run's
``metrics.jsonl`` and the log tail when it fails (the end-of-run report is olmx.report)."""

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
from olmx.rundir import RunDir, tail


def follow(
    plan: Plan, poll: Callable[[], int | None], *, log_path: Path, console: Console, interval: float = 0.5
) -> int:
    """Draw progress until ``poll()`` returns an exit code; raise RunFailed on failure."""
    metrics = RunDir(plan.run_dir).metrics
    total = plan.run.trainer.max_steps
    progress = Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}"),
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
        task = progress.add_task("train", total=total, completed=plan.resume_step or 0, loss="-", tps="-")
        while True:
            rc = poll()
            offset = _advance(progress, task, metrics, offset)
            if rc is not None:
                break
            time.sleep(interval)
    if rc != 0:
        raise RunFailed(f"training failed with exit code {rc}; last lines of {log_path}:\n{tail(log_path)}", rc)
    return rc


def _advance(progress: Progress, task: int, metrics: Path, offset: int) -> int:
    if not metrics.exists():
        return offset
    with open(metrics) as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind("\n") + 1]
    for line in complete.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        fields: dict[str, Any] = {}
        if r.get("loss") is not None:
            fields["loss"] = f"{r['loss']:.3f}"
        if r.get("tokens_per_s"):
            fields["tps"] = f"{r['tokens_per_s']:,.0f}"
        progress.update(task, completed=r["step"], **fields)  # type: ignore[arg-type]
    return offset + len(complete.encode())


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
