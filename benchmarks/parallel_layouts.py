"""Step time and peak memory of the scaling layouts against their unsharded twin, side by side.

One model (4 blocks of d_model 256, 8 heads, a feed-forward 1,024 wide; 256-token
sequences, 16 a step in micro-batches of 2) trained the same number of steps on the same 4
gloo processes of this machine under each layout: plain DDP (the unsharded twin: every rank a
full replica), the distributed optimizer (ZeRO-2), FSDP, FSDP x tensor parallel 2, DDP x
pipeline 2 (1F1B and Interleaved1F1B), FSDP x tensor parallel 2 x pipeline 2, DDP x Ulysses 2
x pipeline 2. Rounds alternate the order of the layouts; the table gives medians over rounds of

- seconds per step: rank 0's wall clock between the records of steps ``--skip`` and the last
  (``metrics.jsonl``'s ``time``), over the steps between;
- the largest per-process peak (``summary.json``: the resident-set high-water mark on CPU, which
  includes the interpreter, torch and the data loader, some 500 MiB a process; on CUDA
  ``max_memory_allocated``);

each with its ratio to DDP, and checks that every layout's first loss is DDP's (the same
initial model and batch; the pipelines' stages start from other initial weights, so their
first loss differs: marked, not checked). On 2 shared CPU cores, 4 processes measure
communication and scheduling far more than compute; the ratios say what each layout costs
here, not on GPUs.

    python benchmarks/parallel_layouts.py [--rounds 2] [--steps 8] [--skip 3] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_model import OLMX, RESULTS, machine, torch_version  # noqa: E402

MODEL = ["model.d_model=256", "model.n_layers=4", "model.hidden_size=1024", "model.n_heads=8"]
BATCH = ["data.seq_len=256", "trainer.global_batch_size=16", "trainer.micro_batch_size=2"]
COMMON = [
    "trainer.report=false",
    "infra.nproc_per_node=4",
    "eval.interval=0",
    "trainer.save_interval=1000",
    "trainer.warmup_steps=1",
    *MODEL,
    *BATCH,
]
#: name -> (overrides, whether its first loss is the twin's)
LAYOUTS: dict[str, tuple[list[str], bool]] = {
    "ddp (twin)": (["parallel=[ddp]"], True),
    "ddp, distributed optimizer": (["parallel=[ddp]", "parallel.ddp.distributed_optimizer=true"], True),
    "fsdp": (["parallel=[fsdp]"], True),
    "fsdp x tp 2": (["parallel=[fsdp,tp]"], True),
    "ddp x pp 2, 1F1B": (["parallel=[ddp,pp]", "parallel.pp.schedule=1F1B"], False),
    "ddp x pp 2, Interleaved1F1B": (["parallel=[ddp,pp]", "parallel.pp.schedule=Interleaved1F1B"], False),
    "fsdp x tp 2 x pp 2, 1F1B": (["parallel=[fsdp,tp,pp]", "parallel.pp.schedule=1F1B"], False),
    "ddp x ulysses 2 x pp 2, 1F1B": (["parallel=[ddp,ulysses,pp]", "parallel.pp.schedule=1F1B"], False),
}


def measure(overrides: list[str], run_dir: Path, steps: int, skip: int) -> dict[str, float]:
    """One run: seconds per step after ``skip`` steps, the largest peak, the first loss."""
    proc = subprocess.run(
        [*OLMX, "train", *COMMON, *overrides, f"trainer.max_steps={steps}", f"trainer.run_dir={run_dir}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{overrides}: olmx train failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in records}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "s_per_step": (times[steps] - times[skip]) / (steps - skip),
        "peak_mib": max(p["peak_mem_mib"] for p in summary["processes"]),
        "first_loss": records[0]["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=3, help="steps of warm-up left out of the time")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/parallel.md")
    args = parser.parse_args()
    start = time.time()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(LAYOUTS) if r % 2 == 0 else list(reversed(LAYOUTS))
            for name in order:
                run_dir = Path(tmp) / f"round{r}-layout{list(LAYOUTS).index(name)}"
                runs[name].append(measure(LAYOUTS[name][0], run_dir, args.steps, args.skip))
                print(f"round {r + 1}: {name}: {runs[name][-1]}", file=sys.stderr)
    med = {n: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for n, ms in runs.items()}
    twin = med["ddp (twin)"]
    lines = [
        "| layout | s per step | vs ddp | peak per process (MiB) | vs ddp | first loss |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m in med.items():
        same = LAYOUTS[name][1]
        if same and abs(m["first_loss"] - twin["first_loss"]) > 1e-4 * twin["first_loss"]:
            raise SystemExit(f"{name}: first loss {m['first_loss']} is not the twin's {twin['first_loss']}")
        loss = f"{m['first_loss']:.4f}" + (" (= ddp)" if same else " (stages start from other weights)")
        lines.append(
            f"| {name} | {m['s_per_step']:.3f} | {m['s_per_step'] / twin['s_per_step']:.2f} | "
            f"{m['peak_mib']:,.0f} | {m['peak_mib'] / twin['peak_mib']:.2f} | {loss} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.record:
        took = time.time() - start
        text = (
            "# Scaling layouts against their unsharded twin (CPU)\n\n"
            f"Recorded {machine(start)}, torch {torch_version()}, by `python benchmarks/parallel_layouts.py "
            f"--rounds {args.rounds} --steps {args.steps} --skip {args.skip} --record` ({took:,.0f} s): "
            f"{' '.join(MODEL + BATCH)}, 4 gloo processes, medians over {args.rounds} rounds of alternating "
            f"order; seconds per step over steps {args.skip}-{args.steps}.\n\n{table}\n\n"
            "On 2 shared CPU cores, 4 processes: the times measure communication and scheduling (each "
            "layout's collectives and, for a pipeline, its bubble and point-to-point sends) far more than "
            "compute, and the peaks are dominated by each process's fixed ~500 MiB (interpreter, torch, "
            "the data loader): what shrinks (weights, gradients, optimizer state, activations) is "
            "measured against the plan's estimate in memory_model.md. No GPU has run these layouts.\n"
        )
        (RESULTS / "parallel.md").write_text(text)


if __name__ == "__main__":
    main()
