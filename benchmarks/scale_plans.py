"""Plans at published scales, made here without GPUs (``olmx train --dry-run``'s plan).

OLMo 3 32B (``conf/model/olmo3_32b.yaml``) on 64 H100 80GB (8 RunPod nodes of 8), bf16, 8,192
tokens a sequence, 512 sequences a step (4 Mi tokens), one sequence per micro-batch, full
activation checkpointing, under each layout olmx can train it with: FSDP, FSDP x tensor parallel
and FSDP x pipeline parallel. Prints a markdown table of the mesh, each term of the memory
estimate per GPU, the step time at the plan's assumed MFU and what the layout adds (the pipeline
bubble). These are the plan's numbers (:mod:`olmx.plan.memory`, :mod:`olmx.plan.throughput`),
not measurements: no GPU has run them.

    python benchmarks/scale_plans.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmx.plan.memory import gib  # noqa: E402
from olmx.plan.resolve import estimate_run, plan_from_overrides  # noqa: E402
from olmx.registry import registry  # noqa: E402

OLMO3_32B_ON_64_H100 = [
    "model=olmo3_32b",
    "infra=runpod",
    "infra.nodes=8",
    "infra.gpus_per_node=8",
    "infra.gpu_type=NVIDIA H100 80GB HBM3",
    "precision=bf16",
    "data.seq_len=8192",
    "trainer.global_batch_size=512",
    "trainer.micro_batch_size=1",
    "trainer.activation_checkpointing=full",
    "eval.interval=0",
]
LAYOUTS = {
    "fsdp": ["parallel=[fsdp]"],
    "fsdp x tp 4": ["parallel=[fsdp,tp]", "parallel.tp.degree=4"],
    "fsdp x pp 4 (Interleaved1F1B)": ["parallel=[fsdp,pp]", "parallel.pp.degree=4"],
    "fsdp x pp 4 (1F1B)": ["parallel=[fsdp,pp]", "parallel.pp.degree=4", "parallel.pp.schedule=1F1B"],
}


def main() -> None:
    reg = registry()
    print("| layout | mesh | parameters | gradients | optimizer | activations | buffers | peak / usable | step time |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, layout in LAYOUTS.items():
        plan = plan_from_overrides([*OLMO3_32B_ON_64_H100, *layout], reg)
        est = estimate_run(plan.run, plan.world, reg).est
        memory, time = dict(plan.sections["memory"]), dict(plan.sections["time"])
        mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.dims().items())
        usable = memory["estimated peak"].split(" of ")[1].split(" usable")[0]
        terms = (est.params, est.grads, est.optimizer, est.activations, est.buffers)
        print(
            f"| {name} | {mesh} | " + " | ".join(gib(n) for n in terms) + f" | {gib(est.peak)} / {usable} | "
            f"{time['step time'].split(':')[0]} |"
        )


if __name__ == "__main__":
    main()
