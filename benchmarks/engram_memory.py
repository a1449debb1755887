"""Memory per rank of the Engram tables and their optimizer state: replicated vs ``1d``/``2d``.

Computed from the plan: for the paper's Engram-27B table layout (2 Engram layers, N=3, K=8,
n_embed_per_ngram 640 -> rows of width 80, per-head tables of the next primes above 2,262,400:
5.79B table parameters; ``/work/shared/docs/research/engram.md`` §1.10), each layout is resolved
with ``olmx``'s own ``compose`` + ``resolve`` as ``olmx train --dry-run`` would, on slurm
(``infra.nodes`` x 8 GPUs; nothing is submitted), on a 30-block OLMo 3 backbone under bf16 (the
backbone is not the paper's MoE; only the tables are counted). The plan decides the sharding
(``auto`` included) and the mesh; the bytes per rank are the plugin's
``table_state_bytes_per_rank`` (16 bytes a parameter: float32 weight, gradient and Adam's two
moments, on the rank holding the most rows). "transient" is what FSDP adds at each use of a
table left to it: the whole table gathered in bfloat16 and its whole bfloat16 gradient before
the reduce-scatter (the larger of the two layers; sharded tables add only the exchanged rows).
"traffic" is a formula (:func:`traffic`) on the plan's batch: one 4096-token sequence a rank.

``--measure``: also train a scaled-down layout (one layer of 16 x ~25k rows x 80) for one
AdamW step on 2 and 4 gloo processes per layout and count the bytes of each rank's local table
weight, gradient and Adam moments (``Tensor.nbytes`` of the local shards), and the bytes the
sharded tables send (``EngramTable.comm``) for one forward + backward of 4 x 512 tokens a rank
with rows in float32 and in bfloat16.

    .venv/bin/python benchmarks/engram_memory.py [--measure]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The paper's Engram-27B tables (Table 5: "Engram vocab size" 2,262,400 per head, d_mem 1280).
PAPER_27B = [
    "layers.engram.max_ngram_size=3",
    "layers.engram.n_head_per_ngram=8",
    "layers.engram.n_embed_per_ngram=640",
    "layers.engram.vocab_size_per_ngram=[2262400,2262400]",
    "layers.engram.layer_ids=[1,14]",
    "model.n_layers=30",
]
LAYOUTS = {
    "replicated, DDP": ["parallel=[ddp]", "layers.engram.sharding=replicated"],
    "replicated, FSDP": ["parallel=[fsdp]", "layers.engram.sharding=replicated"],
    "1d (FSDP for the rest)": ["parallel=[fsdp]", "layers.engram.sharding=1d"],
    "2d, 8-rank groups (one node)": ["parallel=[fsdp]", "layers.engram.sharding=2d", "layers.engram.shard_degree=8"],
    "auto (the default), FSDP": ["parallel=[fsdp]"],
}
SEQ = 4096


def plan_for(nodes: int, overrides: list[str], tokens: Path):
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    ranks = nodes * 8
    args = [
        "experiment=engram_3p5b",
        f"data.paths=[{tokens}]",
        "infra=slurm",
        f"infra.nodes={nodes}",
        "infra.gpus_per_node=8",
        "infra.nproc_per_node=8",
        f"trainer.global_batch_size={ranks}",
        "trainer.micro_batch_size=1",
        *PAPER_27B,
        *overrides,
    ]
    return plan_from_overrides(args, reg)


def from_plans() -> list[tuple[int, str, str, float, float]]:
    """``(ranks, layout, sharding as decided, GiB per rank, transient GiB)``."""
    from olmx_plugins.layers.engram.config import table_state_bytes_per_rank
    from olmx_plugins.layers.engram.plugin import ENGRAM
    from olmx_plugins.layers.engram.primes import ngram_table_sizes

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.npy"
        with open(tokens, "wb") as f:  # 64 sequences of 4096 uint32 ids (sparse)
            f.truncate(4 * 64 * SEQ)
        for nodes in (1, 8):
            for name, overrides in LAYOUTS.items():
                plan = plan_for(nodes, overrides, tokens)
                cfg = plan.run.layers["engram"]
                sharding = ENGRAM.sharding(cfg, plan)
                sizes = ngram_table_sizes(
                    layer_ids=cfg.layer_ids,
                    max_ngram_size=cfg.max_ngram_size,
                    n_head_per_ngram=cfg.n_head_per_ngram,
                    vocab_size_per_ngram=cfg.vocab_size_per_ngram,
                )
                rows = [sum(s) for s in sizes.values()]
                dim = cfg.n_embed_per_ngram // cfg.n_head_per_ngram
                mesh = plan.mesh
                state = table_state_bytes_per_rank(
                    rows,
                    dim,
                    sharding=sharding,
                    world=mesh.size,
                    shard_degree=cfg.shard_degree,
                    fsdp_shard=mesh.dp_shard if mesh.shards_params else 1,
                )
                transient = max(rows) * dim * (2 + 2) if sharding == "replicated" and mesh.shards_params else 0
                out.append(
                    (
                        mesh.size,
                        name,
                        sharding,
                        state / 2**30,
                        transient / 2**30,
                        traffic(plan, sharding, rows, dim) / 2**30,
                    )
                )
    return out


def traffic(plan, sharding: str, rows: list[int], dim: int) -> float:
    """Upper bound of the bytes one rank sends for the tables in one step (formulas, not
    measured): a replicated table's ring all-reduce (DDP, float32) or all-gather + reduce-scatter
    (FSDP, per micro-batch); a sharded table's row exchange in the compute dtype, every lookup
    counted (no deduplication) and sent off-rank with probability ``(S-1)/S``, plus for ``2d``
    the cross-group gather of touched rows (at most one per lookup)."""
    mesh, dtypes, run = plan.mesh, plan.dtypes, plan.run
    w, params = mesh.size, sum(rows) * dim
    cfg = run.layers["engram"]
    heads = (cfg.max_ngram_size - 1) * cfg.n_head_per_ngram
    micro = run.trainer.global_batch_size // (run.trainer.micro_batch_size * mesh.dp)
    lookups = run.trainer.global_batch_size * run.data.seq_len // w * heads * len(rows)
    wire = dtypes.compute_bytes
    if sharding == "replicated":
        if not mesh.shards_params:
            return 2 * (w - 1) / w * 4 * params
        reduce = 2 if dtypes.reduce != "float32" else 4
        return micro * (w - 1) / w * params * (wire + reduce)
    shards = w if sharding == "1d" else cfg.shard_degree
    replicas = w // shards
    exchange = (shards - 1) / shards * lookups * (8 + 2 * dim * wire)
    return exchange + (replicas - 1) * lookups * (8 + dim * wire)


def _measure_rank(results: dict, layouts: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from olmx_plugins.layers.engram.hashing import ngram_table_sizes
    from olmx_plugins.layers.engram.sharding import EngramTable, table_mesh

    sizes = ngram_table_sizes(layer_ids=[1], max_ngram_size=3, n_head_per_ngram=8, vocab_size_per_ngram=[25_000] * 2)[1]
    rank, world = dist.get_rank(), dist.get_world_size()
    for layout in layouts:
        sharding, degree = (layout.split(":") + [""])[:2]
        mesh = None if sharding == "replicated" else table_mesh(sharding, shard_degree=int(degree) if degree else None)
        table = EngramTable(table_sizes=sizes, dim=80, sharding=sharding, mesh=mesh)
        opt = torch.optim.AdamW(table.parameters(), lr=1e-3, foreach=False)
        ids = torch.randint(0, min(sizes), (4, 512, len(sizes)), generator=torch.Generator().manual_seed(rank))
        table(ids).square().sum().backward()
        opt.step()

        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t

        w = table.weight
        nbytes = sum(local(t).nbytes for t in (w, w.grad, opt.state[w]["exp_avg"], opt.state[w]["exp_avg_sq"]))
        got = torch.tensor([nbytes], dtype=torch.float64)
        dist.all_reduce(got, op=dist.ReduceOp.MAX)
        sent = []
        if table.is_sharded:  # bytes sent, rows in float32 (above) and again in bfloat16
            sent.append(table.comm.total_bytes)
            table.comm.reset()
            table(ids, wire_dtype=torch.bfloat16).square().sum().backward()
            sent.append(table.comm.total_bytes)
        total = torch.tensor(sent or [0, 0], dtype=torch.float64)
        dist.all_reduce(total)
        if rank == 0:
            results[(world, layout)] = (int(got.item()), table.num_rows, [int(v) for v in total.tolist()])


def measure() -> list[tuple[int, str, int, int, list[int]]]:
    """``(processes, layout, measured bytes on the largest rank, formula bytes, [bytes sent by
    all ranks in one forward + backward with float32 rows, with bfloat16 rows])``."""
    import multiprocessing

    from olmo_core.testing import run_distributed_test

    from olmx_plugins.layers.engram.config import table_state_bytes_per_rank

    out = []
    for world, layouts in ((2, ["replicated", "1d"]), (4, ["replicated", "1d", "2d:2"])):
        with multiprocessing.Manager() as manager:
            results = manager.dict()
            run_distributed_test(
                _measure_rank, world_size=world, backend="gloo", start_method="spawn", func_args=(results, layouts)
            )
            for layout in layouts:
                nbytes, rows, sent = results[(world, layout)]
                sharding, degree = (layout.split(":") + [""])[:2]
                formula = table_state_bytes_per_rank(
                    [rows], 80, sharding=sharding, world=world, shard_degree=int(degree) if degree else None
                )
                out.append((world, layout, nbytes, formula, sent))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="also measure a scaled-down layout on 2 and 4 processes")
    args = parser.parse_args()
    print("### Engram-27B tables (5.79B parameters): training state per rank, from the plan\n")
    print(
        "| ranks | layout | sharding (plan) | tables + grads + Adam, GiB / rank | FSDP transient, GiB "
        "| table traffic, GiB / rank / step (formula) |"
    )
    print("|---|---|---|---|---|---|")
    for ranks, name, sharding, state, transient, sent in from_plans():
        print(f"| {ranks} | {name} | {sharding} | {state:,.2f} | {transient:,.1f} | {sent:,.2f} |")
    if args.measure:
        print("\n### Scaled-down layout (1 layer, 16 x ~25k rows x 80 = 32M params), measured\n")
        print(
            "| processes | layout | measured MiB / rank (largest) | formula MiB / rank "
            "| MiB sent (all ranks), fp32 rows | bf16 rows |"
        )
        print("|---|---|---|---|---|---|")
        for world, layout, nbytes, formula, (fp32, bf16) in measure():
            name = layout.replace(":", ", shard_degree ")
            print(
                f"| {world} | {name} | {nbytes / 2**20:,.1f} | {formula / 2**20:,.1f} "
                f"| {fp32 / 2**20:,.2f} | {bf16 / 2**20:,.2f} |"
            )


if __name__ == "__main__":
    main()
