"""Goodput: where a run's wall time went, and which rank holds it up (a leaf: the standard
library, the metric names and the run directory).

Rank 0 of every torchrun attempt keeps a clock ledger,
``RUN_DIR/work/clock/<launch>-<attempt>.json`` (:class:`olmx.worker.clock.Clock`), rewritten
after every step and at the end: when the launch and the process started, when the attempt's
first step began, the seconds its steps spent on data and compute, on evaluation and on
checkpoint saves, its first step's time and the cumulative step time at every checkpoint it
saved. :func:`account` reads every ledger of the run and splits the wall time of its launches
(from each launch's start to its last ledger entry) into :data:`CATEGORIES`:

- ``start-up``: launch to the first step (planning, torchrun, imports, the model, the data,
  loading a checkpoint), for every attempt;
- ``compile``: the first step of an attempt beyond the mean of its other steps (compilation,
  warm-up);
- ``productive``: the steps whose work was kept;
- ``evaluation`` and ``checkpointing``: the evaluations and the saves;
- ``lost``: the steps done again after a failure (those past the checkpoint the next attempt
  resumed from);
- ``restarts``: from a failed attempt's last step or save to the next attempt's start (the
  failure, hang detection, torchrun's teardown and restart);
- ``waiting``: the rest (metrics and bookkeeping between steps, the ends of launches).

``goodput`` is the productive share of the wall time. :func:`straggler` names a rank that is
persistently slower than the median, from the per-rank timing in ``metrics.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from olmx import metrics as names
from olmx.rundir import RunDir

#: The categories of a run's wall time, in the order the bar draws them.
CATEGORIES = ("productive", "start-up", "compile", "evaluation", "checkpointing", "lost", "restarts", "waiting")


def ledgers(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every readable ledger of the run, in the order the attempts started."""
    folder = RunDir(run_dir).clock
    out = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "process_start" in record:
            out.append(record)
    return sorted(out, key=lambda r: r["process_start"])


def account(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's wall time by category (seconds), its total ``wall_s`` and ``goodput`` (the
    productive share); None when no attempt kept a ledger."""
    found = ledgers(run_dir)
    if not found:
        return None
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    wall = 0.0
    for i, ledger in enumerate(found):
        steps = ledger.get("steps", {})
        begun = ledger.get("first_step_start")
        updated = ledger["updated"]
        previous = found[i - 1] if i else None
        same_launch = previous is not None and previous.get("launch") == ledger.get("launch")
        if same_launch and previous is not None:  # a restart within the launch: from the failed
            # attempt's last progress (what it did after, waiting for a peer, is the failure's)
            gap = max(0.0, ledger["process_start"] - _last_progress(previous))
            seconds["restarts"] += gap
            wall += gap
            start = ledger["process_start"]
        else:
            start = min(ledger.get("launch_time") or ledger["process_start"], ledger["process_start"])
        seconds["start-up"] += max(0.0, (begun or updated) - start)
        compile_s = _first_step_excess(steps)
        seconds["compile"] += compile_s
        seconds["productive"] += steps.get("compute", 0.0) + steps.get("data", 0.0) - compile_s
        seconds["evaluation"] += steps.get("evaluation", 0.0)
        seconds["checkpointing"] += steps.get("checkpointing", 0.0)
        restarted = i + 1 < len(found) and found[i + 1].get("launch") == ledger.get("launch")
        wall += max(0.0, (_last_progress(ledger) if restarted else updated) - start)
        redone = _redone(ledger, found[i + 1 :])
        seconds["lost"] += redone
        seconds["productive"] -= redone
    seconds["waiting"] = max(0.0, wall - sum(v for k, v in seconds.items() if k != "waiting"))
    rounded = {k: round(v, 3) for k, v in seconds.items()}
    return {
        "wall_s": round(wall, 3),
        "seconds": rounded,
        "goodput": round(seconds["productive"] / wall, 4) if wall else None,
    }


def _last_progress(ledger: dict[str, Any]) -> float:
    """When the attempt last finished a step or a save (its last entry where not recorded)."""
    return float(ledger.get("progress", ledger["updated"]))


def _first_step_excess(steps: dict[str, Any]) -> float:
    """The first step's time beyond the mean of the attempt's other steps."""
    first, count, total = (
        steps.get("first", 0.0),
        steps.get("count", 0),
        steps.get("compute", 0.0) + steps.get("data", 0.0),
    )
    if count < 2:
        return 0.0
    return max(0.0, first - (total - first) / (count - 1))


def _redone(ledger: dict[str, Any], later: list[dict[str, Any]]) -> float:
    """Step time of ``ledger``'s steps that a later attempt did again: those after the checkpoint
    the next one resumed from (all of them where it resumed from an older one)."""
    if not later or ledger.get("last_step") is None:
        return 0.0
    resumed = later[0].get("resumed_from") or 0
    last = ledger["last_step"]
    if resumed >= last:
        return 0.0
    steps = ledger.get("steps", {})
    at = {int(k): v for k, v in ledger.get("checkpoints", {}).items()}
    kept = at.get(resumed, 0.0) if resumed > (ledger.get("resumed_from") or 0) else 0.0
    total = steps.get("compute", 0.0) + steps.get("data", 0.0)
    # the first step's excess is compile time, counted there, whether or not its step was kept
    return max(0.0, total - kept if kept else total - _first_step_excess(steps))


def bar(result: dict[str, Any], width: int = 40) -> str:
    """One line: a bar of the categories (``#`` productive, ``.`` the rest) and the shares."""
    wall = result["wall_s"] or 1.0
    shares = {k: v / wall for k, v in result["seconds"].items()}
    filled = round(width * shares["productive"])
    parts = [f"{k} {100 * s:.0f}%" for k, s in shares.items() if s >= 0.005]
    # (between bars, not brackets: rich would read "[###...]" in a table as markup and drop it)
    return f"|{'#' * filled}{'.' * (width - filled)}| " + ", ".join(parts) + f" of {_duration(wall)}"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


#: A rank is a straggler when its compute is at least this many times the median ...
STRAGGLER_RATIO = 1.25
#: ... and it is the slowest in at least this share of the last :data:`STRAGGLER_RECORDS`
#: collections (at least 3): persistently, not one slow step.
STRAGGLER_SHARE = 0.8
STRAGGLER_RECORDS = 20


def straggler(records: list[dict[str, Any]]) -> str | None:
    """One line naming a rank persistently slower than the median (its own compute per step,
    :mod:`olmx.worker.stragglers`), from a run's ``metrics.jsonl`` records; None if none is."""
    timed = [r for r in records if r.get(names.SLOWEST_RANK) is not None and r.get(names.COMPUTE_MEDIAN)]
    timed = timed[-STRAGGLER_RECORDS:]
    if len(timed) < 3:
        return None
    slow = [r for r in timed if r[names.COMPUTE_MAX] >= STRAGGLER_RATIO * r[names.COMPUTE_MEDIAN]]
    ranks = [int(r[names.SLOWEST_RANK]) for r in slow]
    rank = max(set(ranks), key=ranks.count) if ranks else None
    hits = [r for r in slow if int(r[names.SLOWEST_RANK]) == rank]
    if rank is None or len(hits) < STRAGGLER_SHARE * len(timed):
        return None
    mine = sum(r[names.COMPUTE_MAX] for r in hits) / len(hits)
    median = sum(r[names.COMPUTE_MEDIAN] for r in hits) / len(hits)
    return (
        f"rank {rank} is slower than the median in {len(hits)} of the last {len(timed)} collections "
        f"(its compute {mine:.3g} s per step against the median {median:.3g} s)"
    )
