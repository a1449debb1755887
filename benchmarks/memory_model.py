"""The plan's memory estimate (``olmx.plan.memory``) against measured peaks, on CPU.

Each configuration is trained for 3 steps with ``olmx train`` (real processes, gloo); the
measured peak is the largest ``peak_mem_mib`` of any process in ``summary.json`` (max RSS on
CPU), minus the peak of a near-empty model run the same way (the interpreter, torch and
OLMo-core). The estimate is the plan's, for a CPU world. Prints a table; append it to
``benchmarks/results/memory.md`` by hand with the machine's load.

    .venv/bin/python benchmarks/memory_model.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLMX = [sys.executable, "-m", "olmx"]
COMMON = ["trainer.report=false", "trainer.max_steps=3", "trainer.save_interval=1000", "trainer.warmup_steps=1"]
MID = ["model.d_model=512", "model.n_layers=4", "model.hidden_size=2048", "model.n_heads=8"]
WIDE = ["model.d_model=1024", "model.n_layers=8", "model.hidden_size=4096", "model.n_heads=16"]
ONE = ["infra.nproc_per_node=1"]
TWO = ["infra.nproc_per_node=2"]
BASE = [*ONE, "model.d_model=32", "model.n_layers=1", "model.hidden_size=64", "model.n_heads=2", "data.seq_len=16"]
BASE += ["trainer.global_batch_size=1", "trainer.micro_batch_size=1"]
CONFIGS = {
    "1 proc, 17M, 4 x 512 tokens": [
        *ONE,
        *MID,
        "data.seq_len=512",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
    ],
    "1 proc, 17M, 4 x 2048 tokens": [
        *ONE,
        *MID,
        "data.seq_len=2048",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
    ],
    "1 proc, 17M, 4 x 2048, AC full": [
        *ONE,
        *MID,
        "data.seq_len=2048",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
        "trainer.activation_checkpointing=full",
    ],
    "1 proc, 135M, 1 x 128 tokens": [
        *ONE,
        *WIDE,
        "data.seq_len=128",
        "trainer.global_batch_size=1",
        "trainer.micro_batch_size=1",
    ],
    "2 proc DDP, 135M": [
        *TWO,
        "parallel=[ddp]",
        *WIDE,
        "data.seq_len=128",
        "trainer.global_batch_size=2",
        "trainer.micro_batch_size=1",
    ],
    "2 proc FSDP, 135M": [
        *TWO,
        "parallel=[fsdp]",
        *WIDE,
        "data.seq_len=128",
        "trainer.global_batch_size=2",
        "trainer.micro_batch_size=1",
    ],
}


def measured_mib(overrides: list[str], run_dir: Path) -> float:
    """The largest per-process peak of a 3-step run."""
    proc = subprocess.run(
        [*OLMX, "train", *COMMON, *overrides, f"trainer.run_dir={run_dir}"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"{overrides}: olmx train failed:\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return max(p["peak_mem_mib"] for p in summary["processes"])


def estimated_mib(overrides: list[str], run_dir: Path) -> tuple[float, float, float]:
    """``(model state, activations, total)`` of the plan's estimate, in MiB."""
    from olmx.config.compose import compose, to_object
    from olmx.plan.memory import estimate
    from olmx.plan.resolve import resolve
    from olmx.registry import registry

    reg = registry()
    plan = resolve(to_object(compose([*COMMON, *overrides, f"trainer.run_dir={run_dir}"], reg), reg), reg)
    e = estimate(plan.run, plan.mesh, plan.params.total, plan.vocab_size, plan.dtypes.param, plan.world.device)
    mib = 1 << 20
    return (e.params + e.grads + e.optimizer + e.buffers) / mib, e.activations / mib, e.peak / mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="Keep the run directories here.")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="olmx-memory-"))
    base = measured_mib(BASE, root / "base")
    print(f"baseline (near-empty model): {base:.0f} MiB\n")
    print(
        f"| {'configuration':32} | state + buffers | activations | estimate | measured - base | measured / estimate |"
    )
    print(f"|{'-' * 34}|----------------:|------------:|---------:|--------------------:|--------------------:|")
    for i, (name, overrides) in enumerate(CONFIGS.items()):
        state, acts, total = estimated_mib(overrides, root / f"e{i}")
        got = measured_mib(overrides, root / f"m{i}") - base
        print(f"| {name:32} | {state:15.0f} | {acts:11.0f} | {total:8.0f} | {got:19.0f} | {got / total:19.2f} |")


if __name__ == "__main__":
    main()
