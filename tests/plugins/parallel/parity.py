"""What the parallel strategies' training tests share: one small run that learns in 6 steps
(lr 0.01), compared against the same run in one process, and its losses (training and held-out)
read back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: 2 blocks of d_model 64, 8 x 64-token sequences per step, 6 steps, a checkpoint at the end.
SMALL = [
    "trainer.report=false",
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=256",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.max_steps=6",
    "trainer.save_interval=6",
    "trainer.lr=0.01",
    "trainer.warmup_steps=1",
    "trainer.micro_batch_size=4",
]


def losses(run: Path) -> list[float]:
    """The training loss of every step of ``run``, from its metrics.jsonl."""
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def eval_losses(run: Path) -> dict[int, float]:
    """The held-out loss of every evaluated step of ``run``, by step."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/loss"] for r in records if "eval/loss" in r}


def copy_as_of(run: Path, to: Path, step: int) -> None:
    """``run`` copied to ``to`` as it was after ``step``: its later checkpoints and metrics records
    left out, so that training ``to`` resumes from ``step`` (under another layout, say)."""
    shutil.copytree(run, to)
    for checkpoint in (to / "checkpoints").glob("step*"):
        if int(checkpoint.name.removeprefix("step")) > step:
            shutil.rmtree(checkpoint)
    metrics = to / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= step]
    metrics.write_text("".join(f"{line}\n" for line in kept))
