"""``olmx runs [ROOT]``: the runs under a runs root at a glance, one row each, read from their
run directories only (torch-free, no plugin loaded, nothing written).

A run directory is a folder holding ``plan.yaml``. Its state comes from its lock (a live
``olmx train`` holds it) and its ``events.jsonl`` (:func:`olmx.events.outcome`); its progress
from ``metrics.jsonl``; its checkpoint is the newest ``checkpoints/stepN`` that carries the
completion mark (olmx publishes it only after the files are verified).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from olmx import metrics as names
from olmx.events import outcome, read_events
from olmx.goodput import account, straggler
from olmx.rundir import RunDir


@dataclass(frozen=True)
class RunRow:
    """One run as ``olmx runs`` lists it."""

    #: The run directory's name.
    name: str
    #: Its path.
    path: str
    #: ``running``, ``finished``, ``stopped``, ``hung`` (the hang watchdog ended it), ``failed``,
    #: ``no end recorded``, ``not started`` or
    #: ``unknown`` (its lock file is unreadable: olmx cannot tell whether it runs).
    state: str
    #: What the state rests on (the lock's holder, the stop's reason, the last message).
    detail: str
    #: Last step with a metrics record (0: none).
    step: int
    #: ``trainer.max_steps`` of its plan (None: the plan cannot be read).
    max_steps: int | None
    #: Training loss of the last step that has one.
    loss: float | None
    #: Newest complete checkpoint's step (None: none).
    checkpoint: int | None
    #: Tokens trained on up to the last record.
    tokens: int
    #: The productive share of its wall time (:func:`olmx.goodput.account`; None: no ledger).
    goodput: float | None = None
    #: A rank persistently slower than the median (:func:`olmx.goodput.straggler`), or None.
    straggler: str | None = None


def run_dirs(root: Path) -> list[Path]:
    """The run directories directly under ``root`` (folders holding ``plan.yaml``), by name."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "plan.yaml").is_file())


def run_row(path: Path) -> RunRow:
    """The row of the run directory ``path``."""
    rd = RunDir(path)
    records = _records(rd.metrics)
    last = records[-1] if records else {}
    losses = [r[names.LOSS] for r in records if r.get(names.LOSS) is not None]
    state, detail = _state(rd)
    return RunRow(
        name=path.name,
        path=str(path),
        state=state,
        detail=detail,
        step=int(last.get("step", 0)),
        max_steps=_max_steps(path / "plan.yaml"),
        loss=losses[-1] if losses else None,
        checkpoint=rd.latest_checkpoint(),
        tokens=int(last.get(names.TOKENS) or 0),
        goodput=(account(path) or {}).get("goodput"),
        straggler=straggler(records),
    )


def _state(rd: RunDir) -> tuple[str, str]:
    holder = rd.lock_holder()
    if holder is not None and holder.unreadable:
        return "unknown", f"unreadable lock file {rd.lock_file} (not one olmx wrote); the next olmx train takes it over"
    if holder is not None:
        alive = holder.state()
        if alive == "alive":
            return "running", holder.describe()
        if alive == "unknown":
            return "running", f"locked by {holder.describe()} (another host: olmx cannot see it)"
    events = read_events(rd.path)
    if not events:
        return "not started", "planned only (no events.jsonl)"
    marks = [i for i, e in enumerate(events) if e["event"] in ("start", "end", "hang")]
    if marks and events[marks[-1]]["event"] == "start":  # the last attempt wrote no end
        failed = [e for e in events[marks[-1] :] if e["event"] == "rank_failed"]
        if failed:
            f = failed[-1]
            return "failed", f"node {f.get('node_rank')} local rank {f.get('local_rank')} {f.get('cause', 'failed')}"
        return "no end recorded", "a launch started and wrote no end (a detached job still running, or killed)"
    result = outcome(rd.path)
    state = {"complete": "finished", "stopped": "stopped", "nonfinite": "stopped", "hang": "hung"}.get(
        result.state, "failed"
    )
    return state, result.message


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by a kill
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


def _max_steps(plan: Path) -> int | None:
    """``trainer.max_steps`` of a saved plan (None: a cut or hand-edited plan; the row says "?")."""
    from olmx.plan.codec import saved_config

    trainer = (saved_config(plan) or {}).get("trainer")
    value = trainer.get("max_steps") if isinstance(trainer, dict) else None
    return value if isinstance(value, int) else None


def as_json(rows: list[RunRow]) -> str:
    """The rows as a JSON list (``olmx runs --json``)."""
    return json.dumps([asdict(r) for r in rows], indent=2)
