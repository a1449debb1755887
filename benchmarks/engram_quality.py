"""Engram's quality gain on the embedded corpus: held-out loss of the tiny backbone, the
backbone with Engram (``experiment=engram_tiny``) and a dense backbone with the same total
parameters, at equal steps and tokens, over several seeds.

The standard library's ``.py`` files (the embedded corpus) are split by file: every 20th file
is held out and never trained on. Each model trains with ``olmx train`` (2 gloo processes,
DDP, the same schedule, batch and steps) on the other files, first to 60% of the steps
(``trainer.stop_at_step``) and then, resumed, to the end; after each part the checkpoint is
loaded into one process (``olmx.local_model``) and its mean cross-entropy is taken over the
same held-out tokens (windows of ``data.seq_len``). The issue's goals: Engram below both at
the end, and Engram at 60% of the steps at or below the backbone's final held-out loss.

    .venv/bin/python benchmarks/engram_quality.py [--seeds 3] [--steps 150] [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OLMX = [sys.executable, "-m", "olmx"]
#: hidden_size of a dense tiny backbone with about engram_tiny's total parameters (checked below).
DENSE_HIDDEN = 888
MODELS = {
    "backbone (tiny)": [],
    "backbone + Engram (engram_tiny)": ["experiment=engram_tiny"],
    f"dense, same parameters (hidden {DENSE_HIDDEN})": [f"model.hidden_size={DENSE_HIDDEN}"],
}
HELD_OUT_TOKENS = 131072


def split_corpus(work: Path) -> tuple[str, Path]:
    """Copy the stdlib files into ``train/`` and ``heldout/`` (every 20th file held out)."""
    from olmx.data.files import stdlib_files

    train, held = work / "train", work / "heldout"
    for d in (train, held):
        d.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(stdlib_files()):
        shutil.copyfile(f, (held if i % 20 == 0 else train) / f"{i:05d}.py")
    return f"{train}/*.py", held


def run(args: list[str]) -> None:
    proc = subprocess.run([*OLMX, "train", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"olmx train {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def held_out_loss(run_dir: Path, step: int, held: Path) -> float:
    """Mean next-token cross-entropy of the checkpoint over the held-out tokens."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from olmx.local_model import load_model, local_plan, one_process, verified_checkpoint
    from olmx.registry import registry

    reg = registry()
    plan = local_plan(run_dir, reg)
    seq, eos = plan.batch.seq_len, plan.run.data.tokenizer.eos_id
    ids: list[int] = []
    for f in sorted(held.glob("*.py")):
        ids += list(f.read_bytes()) + [eos]
        if len(ids) >= HELD_OUT_TOKENS + 1:
            break
    n = (len(ids) - 1) // seq
    tokens = torch.tensor(np.array(ids[: n * seq + 1]), dtype=torch.long)
    x, y = tokens[:-1].view(n, seq), tokens[1:].view(n, seq)
    with one_process(plan):
        model = load_model(plan, reg, verified_checkpoint(run_dir, step))
        model.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(0, n, 8):
                logits = model(x[i : i + 8]).float()
                total += F.cross_entropy(logits.flatten(0, 1), y[i : i + 8].flatten(), reduction="sum").item()
    count = n * seq
    return total / count


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def total_params(overrides: list[str]) -> int:
    """The plan's total parameter count for these overrides."""
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    return plan_from_overrides(overrides, reg).params.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--work", type=Path, help="Keep the corpus split and the runs here.")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="olmx-engram-quality-"))
    train_glob, held = split_corpus(work)
    early = math.ceil(0.6 * args.steps)
    common = [
        "trainer.report=false",
        "data=text",
        f"data.paths=[{train_glob}]",
        f"trainer.max_steps={args.steps}",
        f"trainer.save_interval={early}",
    ]
    results: dict[str, list[tuple[float, float]]] = {}
    for index, (name, overrides) in enumerate(MODELS.items()):
        print(f"{name}: {total_params([*overrides, *common, f'trainer.run_dir={work}/plan-check']):,} parameters")
        for seed in range(args.seeds):
            run_dir = work / f"{index}-{seed}"
            base = [*overrides, *common, f"trainer.seed={seed}", f"trainer.run_dir={run_dir}"]
            run([*base, f"trainer.stop_at_step={early}"])
            at_early = held_out_loss(run_dir, early, held)
            run(base)  # resumes from step `early` to the end
            at_end = held_out_loss(run_dir, args.steps, held)
            results.setdefault(name, []).append((at_early, at_end))
            print(f"{name}, seed {seed}: held-out loss {at_early:.4f} at step {early}, {at_end:.4f} at {args.steps}")
        print()
    print(f"| model | held-out loss at step {early} (mean ± sd) | at step {args.steps} (mean ± sd) |")
    print("|---|---:|---:|")
    for name, rows in results.items():
        e, f = [r[0] for r in rows], [r[1] for r in rows]
        print(f"| {name} | {statistics.mean(e):.4f} ± {_sd(e):.4f} | {statistics.mean(f):.4f} ± {_sd(f):.4f} |")


if __name__ == "__main__":
    main()
