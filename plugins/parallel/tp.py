"""Tensor parallelism: each block's weight matrices split over a group of ranks (OLMo-core's TP).

``parallel=[fsdp,tp] parallel.tp.degree=2``: groups of ``degree`` ranks hold one slice each of
every attention and feed-forward weight (query/key/value and the first feed-forward
projections by output columns, the output projections by input rows), of the embedding (by
vocabulary rows) and of the output head; the norms run sequence-parallel (each rank normalises
``seq_len / degree`` positions). The world divided by the degree does data parallelism with the
other strategy (``ddp``, ``fsdp``, ``hsdp``): OLMo-core builds the ``(dp, tp)`` mesh, loads data
over the data-parallel ranks only, and shards or replicates the TP-sharded parameters over them.

What comes from OLMo-core 3.0.0: ``TransformerTensorParallelConfig`` (the train module's
``tp_config``), ``Transformer.apply_tp`` (torch's ``ColwiseParallel`` / ``RowwiseParallel`` /
``SequenceParallel`` plans). What olmx adds: the mesh dimension (``tp``, claimed here and
validated with the others by the plan), the checks of the degree against the world, the heads,
the hidden sizes and the sequence length before anything starts, and the plan's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, ParallelPlugin, World, setting
from olmx.errors import ConfigError


@dataclass(frozen=True)
class TensorParallelConfig:
    """Settings of ``parallel.tp``."""

    #: Ranks that share every weight matrix of a block (the tensor-parallel group size). It must
    #: divide the world size, ``model.n_heads``, the kv heads, ``model.hidden_size`` and
    #: ``data.seq_len``; keep it within one node (its collectives run every layer).
    degree: int = setting(2, ge=1)
    #: OLMo-core's async tensor parallelism (experimental): inductor's micro-pipelined TP
    #: splits each all-gather and reduce-scatter around the matmuls that use them so that they
    #: overlap, through symmetric memory. Needs CUDA and ``trainer.compile`` (an inductor pass).
    async_tp: bool = setting(False)


class TensorParallel(ParallelPlugin):
    """OLMo-core tensor parallelism with sequence-parallel norms."""

    name = "tp"
    api = ">=3.0,<4"
    Config = TensorParallelConfig
    provides = ("tensor",)

    def options(self, cfg: TensorParallelConfig | None, run: Any, world: World) -> list[tuple[str, Any]]:
        """Under ``parallel=auto``: each degree from 2 up to a node's processes that divides the
        world, the heads, the kv heads, ``model.hidden_size`` and ``data.seq_len``, smallest first
        (tensor parallelism's collectives run every layer: keep it within a node)."""
        if cfg is not None:
            return [("", cfg)]
        m = run.model
        sliced = (m.n_heads, m.n_kv_heads or m.n_heads, m.hidden_size, run.data.seq_len, world.size)
        degrees = [p for p in range(2, world.nproc_per_node + 1) if all(n % p == 0 for n in sliced)]
        return [(f"parallel.tp.degree={p}", TensorParallelConfig(degree=p)) for p in degrees]

    def claim(self, cfg: TensorParallelConfig, run: Any, world: World) -> dict[str, int]:
        """Check the degree against the model's sliced dimensions; claim ``tp``."""
        p, m = cfg.degree, run.model
        sliced = {
            "model.n_heads": m.n_heads,
            "model.n_kv_heads": m.n_kv_heads or m.n_heads,
            "model.hidden_size": m.hidden_size,
            "data.seq_len": run.data.seq_len,
        }
        for field, n in sliced.items():
            if n % p:
                raise ConfigError(
                    f"{self.section}.degree",
                    f"{p} must divide {field}={n}: each of the {p} ranks holds 1/{p} of it",
                )
        return {"tp": p}

    def resolve(self, cfg: TensorParallelConfig, ctx: Context) -> Contribution:
        """What each rank holds and what crosses between the ranks of a group; async TP's
        needs."""
        p, m, t = cfg.degree, ctx.run.model, ctx.run.trainer
        if cfg.async_tp and ctx.world.device != "cuda":
            raise ConfigError(
                f"{self.section}.async_tp",
                f"needs CUDA (symmetric memory between the ranks' GPUs); this run's device is {ctx.world.device}",
            )
        if cfg.async_tp and ctx.execution is not None and not ctx.execution.compile:
            raise ConfigError(
                f"{self.section}.async_tp",
                "is an inductor pass over the compiled blocks: set trainer.compile=true (or leave it at auto on CUDA)",
            )
        tokens = t.micro_batch_size * ctx.run.data.seq_len
        b = ctx.dtypes.compute_bytes
        # per block, forward: the attention and feed-forward outputs are reduce-scattered and
        # the norms' outputs all-gathered (sequence parallel), each a tokens x d_model tensor
        moved = 4 * tokens * m.d_model * b * (p - 1) // p
        rows = [
            ("degree", f"{p} ranks per weight, {ctx.world.size // p} tensor-parallel group(s)"),
            (
                "per rank",
                f"{m.n_heads // p} of {m.n_heads} query heads, "
                f"{(m.n_kv_heads or m.n_heads) // p} of {m.n_kv_heads or m.n_heads} kv heads, "
                f"{m.hidden_size // p:,} of {m.hidden_size:,} feed-forward units, "
                f"{ctx.run.data.seq_len // p:,} of {ctx.run.data.seq_len:,} positions in the norms",
            ),
            (
                "traffic per block",
                f"{moved / 2**20:,.2f} MiB per rank forward and as much backward "
                f"(2 all-gathers + 2 reduce-scatters of {tokens:,} x {m.d_model} at {b} bytes)"
                + (", overlapped with the matmuls (async TP)" if cfg.async_tp else ""),
            ),
        ]
        return Contribution(rows=rows)

    def apply_train_module(
        self, cfg: TensorParallelConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]
    ) -> Any:
        """Set OLMo-core's ``tp_config``."""
        from olmo_core.train.train_module import TransformerTensorParallelConfig

        train_module.tp_config = TransformerTensorParallelConfig(degree=cfg.degree, enable_async=cfg.async_tp)
        return train_module


TP = TensorParallel()
