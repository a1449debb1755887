"""Tiny MoE on 2 CPU processes: tokens/s and peak memory per process under fsdp, hsdp and ddp_ep.

Every configuration is a real ``olmx train`` run (torchrun, 2 gloo processes, the OLMo-core
Trainer) of the same tiny MoE model and data, so the numbers include everything a user's run
pays: the strategy's communication, the portable MoE's dispatch, the optimizer and the
Trainer's callbacks. Configurations:

- ``fsdp``: every parameter (experts included) sharded over both processes (FSDP2);
- ``hsdp``: the default layout on one node (``dp_replicate=1 x dp_shard=2``; the same sharding
  as fsdp, through OLMo-core's HSDP code path);
- ``hsdp+ep``: ``parallel.hsdp.expert_parallel=true``, experts split over the shard group (EP
  degree 2, tokens moved with all-to-all), the dense part HSDP-sharded;
- ``ddp_ep``: ``parallel.ddp_ep.degree=2``, dense part replicated (DDP), experts split.

Measured, from the run's ``summary.json``: tokens/s per process (olmx's metrics callback:
tokens of the steps after the first, over the wall time from the end of step 1 to the end of
the last step, so start-up and the first step's warm-up are excluded) and peak memory per
process (``ru_maxrss``: the resident-set high-water mark of the whole process over the whole
run: Python, torch, OLMo-core, model, gradients, AdamW state, activations, buffers, and the
final checkpoint save). Runs are interleaved: each round runs every configuration once, in an
order rotated by one from round to round; the table reports medians over rounds and the ratio
to fsdp. All configurations must log the same losses (checked, relative 1e-4).

CPU numbers do not predict GPU ones: on CPU the gloo all-to-all and all-gathers are memory
copies between processes sharing 2 cores, and the tiny model is dominated by framework
overhead, whereas on GPUs the trade-off is NVLink/InfiniBand bandwidth against HBM and
kernel launch latency.

    python benchmarks/moe.py [--rounds 2] [--steps 12] [--out benchmarks/results/moe.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The tiny MoE run: d_model 64, 2 layers (both MoE), 8 experts of SwiGLU hidden 128, top-2,
#: 8 x 128-token sequences per step (4 per process, one micro-batch).
MODEL = [
    "layers=[moe]",
    "layers.moe.num_experts=8",
    "layers.moe.top_k=2",
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.hidden_size=128",
    "data.seq_len=128",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.warmup_steps=2",
    "infra.nproc_per_node=2",
]
CONFIGS = {
    "fsdp": ["parallel=[fsdp]"],
    "hsdp": ["parallel=[hsdp]"],
    "hsdp+ep": ["parallel=[hsdp]", "parallel.hsdp.expert_parallel=true"],
    "ddp_ep": ["parallel=[ddp_ep]", "parallel.ddp_ep.degree=2"],
}


def train(name: str, run_dir: Path, steps: int) -> dict:
    """One ``olmx train`` run; its per-process tokens/s and peak MiB, losses and wall time."""
    cmd = [
        sys.executable,
        "-m",
        "olmx",
        "train",
        *MODEL,
        *CONFIGS[name],
        f"trainer.max_steps={steps}",
        f"trainer.save_interval={steps + 1}",
        f"trainer.run_dir={run_dir}",
    ]
    env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    processes = summary["processes"]
    return {
        "tokens_per_s": statistics.mean(p["tokens_per_s"] for p in processes),
        "peak_mib": max(p["peak_mem_mib"] for p in processes),
        "losses": [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()],
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "results" / "moe.md",
        help="the results page written (with the method and the caveat)",
    )
    args = parser.parse_args()
    import torch

    names = list(CONFIGS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="olmx-moe-bench-") as tmp:
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                res = train(name, Path(tmp) / f"{name}-{r}", args.steps)
                results[name].append(res)
                print(
                    f"round {r + 1} {name}: {res['tokens_per_s']:.0f} tokens/s/process, "
                    f"{res['peak_mib']:.0f} MiB, run {res['wall_s']:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

    ref_losses = results["fsdp"][0]["losses"]
    for name, runs in results.items():
        for res in runs:
            worst = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref_losses, strict=True))
            assert worst < 1e-4, f"{name} logged other losses than fsdp (relative difference {worst:.1e})"

    def med(name: str, key: str) -> float:
        return statistics.median(res[key] for res in results[name])

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# MoE under fsdp, hsdp and ddp_ep: tokens/s and peak memory, 2 CPU processes (issue 4)",
        "",
        f"Script: `benchmarks/moe.py` (`.venv/bin/python benchmarks/moe.py --rounds {args.rounds} "
        f"--steps {args.steps}`); its docstring has the full method.",
        "",
        "**CPU numbers do not predict GPU ones.** Here gloo collectives are memory copies between two "
        "processes sharing 2 cores and a model this small is dominated by framework overhead; on GPUs the "
        "trade-off is interconnect bandwidth against HBM and kernel latency (OLMo-core 3 reports 2.7x "
        "tokens/s/GPU for DDP+EP over its FSDP stack on a 47B MoE).",
        "",
        "Run: the same `olmx train` of a tiny MoE (d_model 64, 2 layers, both MoE: 8 experts of SwiGLU "
        "hidden 128, top-2 softmax, dropless; 8 x 128-token sequences per step, fp32, AdamW), 2 gloo "
        "processes under torchrun, under each strategy: `fsdp`; `hsdp` (1 x 2 on one node, the same "
        "sharding as fsdp through OLMo-core's HSDP path); `hsdp+ep` (`parallel.hsdp.expert_parallel=true`, "
        "experts split over the 2 processes); `ddp_ep` (`parallel.ddp_ep.degree=2`: dense part replicated, "
        "experts split). Runs interleaved: every round runs each strategy once, the order rotated by one per "
        "round.",
        "",
        "How measured: from each run's `summary.json`. Tokens/s per process: olmx's metrics callback, the "
        "steps after the first over the wall time from the end of step 1 to the end of the last step "
        "(start-up and warm-up excluded). Peak memory: `ru_maxrss` of each process, the resident-set "
        "high-water mark of the whole run (Python, torch, OLMo-core, model, gradients, AdamW state, "
        "activations, communication buffers, final checkpoint save); the larger of the 2 processes. "
        "Medians over rounds; ratios against fsdp.",
        "",
        f"Measured {datetime.now():%Y-%m-%d %H:%M} ({os.cpu_count()} CPUs, load average {load} at the end, "
        f"torch {torch.__version__}); {args.rounds} rounds x {args.steps} steps, 2 processes, 1,024 tokens "
        f"per process per step.",
        "",
        "| strategy | tokens/s per process (median) | vs fsdp | peak RSS MiB per process (max of 2, median) "
        "| vs fsdp | per round tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        tps, mib = med(name, "tokens_per_s"), med(name, "peak_mib")
        rounds = ", ".join(f"{res['tokens_per_s']:.0f}" for res in results[name])
        lines.append(
            f"| {name} | {tps:,.0f} | {tps / med('fsdp', 'tokens_per_s'):.2f}x | {mib:,.0f} | "
            f"{mib / med('fsdp', 'peak_mib'):.2f}x | {rounds} |"
        )
    lines.append("")
    lines.append(f"All runs logged the same losses as fsdp within 1e-4 relative (last: {ref_losses[-1]:.4f}).")
    lines.append("")
    lines.append(
        "At this size the peak RSS is the Python, torch and OLMo-core runtime: the model's whole state "
        "(about 480k parameters; with gradients and AdamW moments under 8 MiB, unsharded) does not show, "
        "so the memory column says only that no strategy adds buffers of note. On this shared 2-core "
        "machine the rounds differ by up to 25%: read the tokens/s ratios as within noise of each other "
        "unless both rounds agree."
    )
    table = "\n".join(lines)
    print(table)
    args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
