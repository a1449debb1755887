"""Plans at published scales, made here without GPUs (``olmx train --dry-run``'s plan).

Three published setups, each under the layouts olmx can train it with; a markdown table per
setup of the mesh, each term of the memory estimate per GPU, the peak against the usable memory
and the step time at the plan's assumed MFU (plus the pipeline bubble). These are the plan's
numbers (:mod:`olmx.plan.memory`, :mod:`olmx.plan.throughput`), not measurements: no GPU has
run them.

* OLMo 3 32B (``conf/model/olmo3_32b.yaml``) on 64 H100 80GB (8 RunPod nodes of 8), bf16, 8,192
  tokens a sequence, 512 sequences a step (4 Mi tokens), one sequence per micro-batch, full
  activation checkpointing: FSDP, FSDP x tensor parallel, FSDP x pipeline parallel, all three.
* OLMo-core 3's 8-layer MoE benchmark model (``src/examples/olmo_ddp/moe_8l_common.py`` and
  ``moe_8l_ddp.py`` on OLMo-core's main branch: d_model 4096, 32 heads of 128 with 8 KV heads,
  block 0 dense with a 20,480-wide MLP, blocks 1-7 with top-4 of routed SwiGLU(4096 -> 4096)
  experts plus one shared expert of 4096, capacity factor 1.25, 8,192-token sequences, two
  per micro-batch) under DDP + expert parallel on B300s:
  - with 32 experts (13.0B parameters, 3.2B active) on 4 B300 with EP 4, 64 sequences a step
    (512 Ki tokens): the OLMo-core 3 report's Table 26, whose BF16 baseline peaks at 103.4 GiB
    a GPU (MXFP8 ~95 GiB, from the blog);
  - with 128 experts (46.9B, 3.2B active) on 8 B300 with EP 8, 512 sequences a step (4 Mi
    tokens): its Fig. 4 (52k tokens/s/GPU).
* OLMo-core 3's 1.2T MoE (``OLMoE3-dev-u001.py``, the report's Table 30: 858 TFLOP/s/GPU on 512
  B300): d_model 6144, 63 blocks (0 and 1 dense with 40,960-wide MLPs), top-4 of 128 routed
  SwiGLU(6144 -> 8192) experts plus a shared one of 8192, capacity factor 1.1875, MXFP8, full
  recompute, 8,192-token sequences one per micro-batch, 8,192 a step (64 Mi tokens), pipeline 8
  (Interleaved 1F1B, two stages a rank) x expert parallel 8 over 64 data-parallel ranks a stage.
  olmx's attention is ``d_model`` wide, so it plans 48 heads of 128 with 24 KV heads where the
  model has 64 with 32 (an 8,192-wide attention): 2.4B fewer parameters, 0.2%.

Then OLMo-core's own OLMo 3 recipes (``experiment=olmo3_7b``, ``experiment=olmo3_32b``) at the
published cluster shapes (7B on 1 and 64 nodes of 8 H100s, 32B on 128) under ``parallel=auto``:
the script's layout with its estimate beside auto's choice (the plan's ``auto`` rows), and the
predicted tokens/s per GPU (the downstream task set is left out: planning it tokenizes every
task with dolma2's tokenizer.json, which need not be on the machine).

The data is a sparse token file of the published tokenizer's ids (dolma2: 100,278 ids, padded
to 100,352), large enough for one step, written to a temporary folder (the plan reads sizes and
samples ids; nothing is trained).

    python benchmarks/scale_plans.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmx.plan.memory import gib  # noqa: E402
from olmx.plan.resolve import estimate_run, plan_from_overrides  # noqa: E402
from olmx.registry import registry  # noqa: E402

#: The published runs' tokenizer (OLMo-core's dolma2 ids), on pre-tokenized data.
DOLMA2 = ["data=numpy", "data.tokenizer.name=dolma2"]


def nodes_of(gpu: str, gpus: int) -> list[str]:
    """RunPod nodes of 8 GPUs (or one node of fewer)."""
    per_node = min(8, gpus)
    return [
        "infra=runpod",
        f"infra.nodes={gpus // per_node}",
        f"infra.gpus_per_node={per_node}",
        f"infra.gpu_type={gpu}",
    ]


OLMO3_32B_ON_64_H100 = [
    "model=olmo3_32b",
    *nodes_of("NVIDIA H100 80GB HBM3", 64),
    "precision=bf16",
    "data.seq_len=8192",
    "trainer.global_batch_size=512",
    "trainer.micro_batch_size=1",
    "trainer.activation_checkpointing=full",
    "eval.interval=0",
]


def moe_8l(experts: int) -> list[str]:
    """OLMo-core's 8-layer MoE benchmark model with ``experts`` routed experts."""
    return [
        "model.d_model=4096",
        "model.n_layers=8",
        "model.n_heads=32",
        "model.n_kv_heads=8",
        "model.hidden_size=20480",
        "model.qk_norm=true",
        "layers=[moe]",
        "layers.moe.blocks=[1,2,3,4,5,6,7]",
        f"layers.moe.num_experts={experts}",
        "layers.moe.top_k=4",
        "layers.moe.hidden_size=4096",
        "layers.moe.shared_hidden_size=4096",
        "layers.moe.capacity_factor=1.25",
        "data.seq_len=8192",
        "trainer.micro_batch_size=2",
        "eval.interval=0",
    ]


MOE_13B_ON_4_B300 = [*moe_8l(32), *nodes_of("NVIDIA B300", 4), "trainer.global_batch_size=64"]
MOE_47B_ON_8_B300 = [*moe_8l(128), *nodes_of("NVIDIA B300", 8), "trainer.global_batch_size=512"]
MOE_1T_ON_512_B300 = [
    "model.d_model=6144",
    "model.n_layers=63",
    "model.n_heads=48",
    "model.n_kv_heads=24",
    "model.hidden_size=40960",
    "model.qk_norm=true",
    "layers=[moe]",
    f"layers.moe.blocks=[{','.join(str(b) for b in range(2, 63))}]",
    "layers.moe.num_experts=128",
    "layers.moe.top_k=4",
    "layers.moe.hidden_size=8192",
    "layers.moe.shared_hidden_size=8192",
    "layers.moe.capacity_factor=1.1875",
    *nodes_of("NVIDIA B300", 512),
    "data.seq_len=8192",
    "trainer.micro_batch_size=1",
    "trainer.global_batch_size=8192",
    "trainer.activation_checkpointing=full",
    "eval.interval=0",
]

#: (title, the run's overrides, {layout: overrides}, what was published about it)
SETUPS = [
    (
        "OLMo 3 32B on 64 H100 80GB",
        [*OLMO3_32B_ON_64_H100, *DOLMA2],
        {
            "fsdp": ["parallel=[fsdp]"],
            "fsdp x tp 4": ["parallel=[fsdp,tp]", "parallel.tp.degree=4"],
            "fsdp x pp 4 (Interleaved1F1B)": ["parallel=[fsdp,pp]", "parallel.pp.degree=4"],
            "fsdp x pp 4 (1F1B)": ["parallel=[fsdp,pp]", "parallel.pp.degree=4", "parallel.pp.schedule=1F1B"],
            "fsdp x tp 4 x pp 2 (Interleaved1F1B)": ["parallel=[fsdp,tp,pp]", "parallel.tp.degree=4"],
        },
        "",
    ),
    (
        "13B MoE (32 experts) on 4 B300, DDP + EP 4",
        [*MOE_13B_ON_4_B300, *DOLMA2, "parallel=[ddp_ep]", "parallel.ddp_ep.degree=4"],
        {"bf16": ["precision=bf16"], "mxfp8": ["precision=mxfp8"]},
        "published peak: 103.4 GiB (BF16), ~95 GiB (MXFP8)",
    ),
    (
        "47B MoE (128 experts) on 8 B300, DDP + EP 8",
        [*MOE_47B_ON_8_B300, *DOLMA2, "parallel=[ddp_ep]", "parallel.ddp_ep.degree=8"],
        {"bf16": ["precision=bf16"], "mxfp8": ["precision=mxfp8"]},
        "published: 52k tokens/s/GPU (BF16)",
    ),
    (
        "1.2T MoE on 512 B300, PP 8 x EP 8",
        [*MOE_1T_ON_512_B300, *DOLMA2, "parallel=[ddp_ep,pp]", "parallel.ddp_ep.degree=8", "parallel.pp.degree=8"],
        {
            "mxfp8, Interleaved1F1B": ["precision=mxfp8"],
            "mxfp8, Interleaved1F1B, ZeRO-2 dense": ["precision=mxfp8", "parallel.ddp_ep.distributed_optimizer=true"],
        },
        "published: 858 TFLOP/s/GPU (MXFP8)",
    ),
]


def token_file(folder: Path, tokens: int) -> Path:
    """A sparse raw uint32 token file of ``tokens`` ids (all 0: a valid id; no disk used)."""
    path = folder / "tokens.npy"
    with open(path, "wb") as f:
        f.truncate(4 * tokens)
    return path


def main() -> None:
    reg = registry()
    with tempfile.TemporaryDirectory() as tmp:
        data = token_file(Path(tmp), 8192 * 8192 + 8192)  # one step of the largest run
        for title, run, layouts, published in SETUPS:
            print(f"\n### {title}\n")
            print(
                "| layout | parameters (active) | mesh | params | grads | optimizer | activations | buffers "
                "| peak / usable | step time |"
            )
            print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
            for name, layout in layouts.items():
                plan = plan_from_overrides([*run, f"data.paths=[{data}]", *layout], reg)
                est = estimate_run(plan.run, plan.world, reg).est
                memory, time = dict(plan.sections["memory"]), dict(plan.sections["time"])
                mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.dims().items())
                usable = memory["estimated peak"].split(" of ")[1].split(" usable")[0]
                terms = (est.params, est.grads, est.optimizer, est.activations, est.buffers)
                sizes = f"{plan.params.total / 1e9:.1f}B ({plan.params.active / 1e9:.1f}B)"
                step = time["step time"].split(" at trainer.assumed_mfu")[0]
                if "idle" in time["step time"]:
                    step += f" ({time['step time'].split(' with ')[1].split(' of it')[0]} bubble)"
                print(
                    f"| {name} | {sizes} | {mesh} | "
                    + " | ".join(gib(n) for n in terms)
                    + f" | {gib(est.peak)} / {usable} | "
                    f"{step} |"
                )
            if published:
                print(f"\n{published}")
        recipes(data, reg)


#: ``(recipe, nodes of 8 H100s)`` at the published cluster shapes.
RECIPES = [("olmo3_7b", 1), ("olmo3_7b", 64), ("olmo3_32b", 128)]


def recipes(data: Path, reg: object) -> None:
    """The recipes table: each recipe's script layout beside ``parallel=auto``'s choice."""
    print("\n### OLMo 3 recipes at published cluster shapes (parallel=auto)\n")
    print(
        "| recipe, world | the script's layout: estimate | auto's choice | auto: estimate | beside it | tokens/s/GPU |"
    )
    print("|---|---|---|---|---|---:|")
    for name, nodes in RECIPES:
        overrides = [f"experiment={name}", "infra=slurm", f"infra.nodes={nodes}", "infra.gpus_per_node=8"]
        overrides += ["infra.gpu_name='NVIDIA H100 80GB HBM3'", f"data.paths=[{data}]", "eval.downstream=[]"]
        plan = plan_from_overrides([*overrides, "parallel=auto"], reg)
        rows = dict(plan.sections["auto"])
        theirs = next(v for k, v in rows.items() if k.endswith("'s layout") and k != "auto's layout")
        per_gpu = dict(plan.sections["time"])["tokens/s"].split(" per device")[0]
        ours = rows["auto's layout"]
        print(
            f"| {name}, {nodes} x 8 H100 | {theirs} | {rows['chosen']} | {ours} "
            f"| {rows.get('beside it', '-')} | {per_gpu} |"
        )


if __name__ == "__main__":
    main()
