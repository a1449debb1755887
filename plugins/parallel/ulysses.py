"""Ulysses sequence parallelism: each sequence sharded over a group of ranks, all-to-all around attention.

``parallel=[fsdp,ulysses] parallel.ulysses.degree=2``: groups of ``degree`` consecutive ranks
share every sequence (each rank holds ``seq_len/degree`` tokens outside attention); the
world divided by the degree does data parallelism with the other strategy (``ddp``, ``fsdp``,
``hsdp``), whose gradient reduction spans data and sequence ranks.

What comes from OLMo-core 3.0.0 (``TransformerContextParallelConfig.ulysses(degree)``, the
train module's ``cp_config``): the ``(dp, cp)`` device mesh and the data loader over the data
ranks only; labels shifted on the whole sequence before sharding (``get_labels`` runs on the
full batch); input ids, labels and the RoPE tables sharded contiguously, so positions are
global; the loss of each rank divided by the micro-batch's global token count and multiplied
by the degree, which the mean over ``dp x cp`` in the gradient reduction undoes.

What olmx adds (:mod:`.ulysses_attention`, installed by :meth:`UlyssesStrategy.apply_model`):
the all-to-all around a single-device attention backend, with DeepSpeed-style kv-head
replication where ``n_kv_heads`` is not a multiple of the degree; this replaces OLMo-core's
in-backend Ulysses code, which fails for MQA and for the torch backend's sliding windows.
And the checks: degree vs world, heads and sequence length, before anything starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

from olmx.api import Context, Contribution, ParallelPlugin, World
from olmx.errors import ConfigError


@dataclass(frozen=True)
class UlyssesConfig:
    """Settings of ``ulysses``."""

    #: Ranks that share one sequence (the sequence-parallel group size). It must divide the
    #: world size, ``model.n_heads`` and ``data.seq_len``. ``auto``: the smallest such degree
    #: (from 2) whose estimated peak memory fits the device; the plan says which and why.
    degree: Union[int, str] = 2


def _degree(cfg: UlyssesConfig) -> int:
    """The degree of settings the plan resolved (``auto`` is replaced before ``claim``)."""
    if isinstance(cfg.degree, bool) or not isinstance(cfg.degree, int):
        raise ConfigError("parallel.ulysses.degree", f"'{cfg.degree}' is not one of: an integer >= 1, auto")
    return cfg.degree


def replicated_kv_heads(n_kv_heads: int, degree: int) -> int:
    """kv heads after DeepSpeed-style replication: ``lcm(n_kv_heads, degree)``."""
    return math.lcm(n_kv_heads, degree)


def all_to_all_bytes(
    *, micro_seqs: int, seq_len: int, n_heads: int, kv_heads: int, head_dim: int, degree: int, elem_bytes: int
) -> dict[str, int]:
    """Bytes one rank hands to all-to-all in one attention layer's forward, per tensor.

    Each rank sends its ``seq_len/degree``-token shard of q (``n_heads`` heads), k and v
    (``kv_heads`` each, after replication) and receives as much; the output goes back the same
    way. ``1/degree`` of each stays on the rank. The backward pass moves the same volume.
    """
    tokens = micro_seqs * seq_len // degree
    return {
        "q": tokens * n_heads * head_dim * elem_bytes,
        "k": tokens * kv_heads * head_dim * elem_bytes,
        "v": tokens * kv_heads * head_dim * elem_bytes,
        "out": tokens * n_heads * head_dim * elem_bytes,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


class UlyssesStrategy(ParallelPlugin):
    """OLMo-core context parallelism in its Ulysses style, with olmx's attention wrapper."""

    name = "ulysses"
    api = ">=3.0,<4"
    Config = UlyssesConfig
    provides = ("sequence",)

    def options(self, cfg: UlyssesConfig | None, run: Any, world: World) -> list[tuple[str, Any]]:
        """With ``degree=auto`` (or under ``parallel=auto``): every degree from 2 up that divides
        the world size, ``model.n_heads`` and ``data.seq_len``, smallest first."""
        if cfg is not None and cfg.degree != "auto":
            return [("", cfg)]
        m, seq = run.model, run.data.seq_len
        degrees = [p for p in range(2, world.size + 1) if not world.size % p and not m.n_heads % p and not seq % p]
        if cfg is not None and not degrees:
            raise ConfigError(
                "parallel.ulysses.degree",
                f"auto: no degree from 2 up divides the world size {world.size}, model.n_heads={m.n_heads} and "
                f"data.seq_len={seq}",
            )
        return [(f"parallel.ulysses.degree={p}", UlyssesConfig(degree=p)) for p in degrees]

    def claim(self, cfg: UlyssesConfig, run: Any, world: World) -> dict[str, int]:
        """Check the degree against the world, the heads and the sequence length; claim ``cp``."""
        p, m, seq = _degree(cfg), run.model, run.data.seq_len
        if p < 1:
            raise ConfigError("parallel.ulysses.degree", f"must be at least 1, got {p}")
        if world.size % p:
            raise ConfigError(
                "parallel.ulysses.degree",
                f"{p} must divide the world size {world.size} ({world.nnodes} node(s) x "
                f"{world.nproc_per_node} processes)",
            )
        if m.n_heads % p:
            raise ConfigError(
                "parallel.ulysses.degree",
                f"{p} must divide model.n_heads={m.n_heads}: each rank attends with n_heads/degree heads",
            )
        if seq % p:
            raise ConfigError(
                "data.seq_len",
                f"{seq} must be divisible by parallel.ulysses.degree={p}: each rank holds "
                f"seq_len/degree tokens (Ulysses shards contiguously; no 2*degree load "
                f"balancing is needed)",
            )
        n_kv = m.n_kv_heads or m.n_heads
        kv = replicated_kv_heads(n_kv, p)
        if kv != n_kv and m.attn_backend == "te":
            raise ConfigError(
                "model.attn_backend",
                f"'te' does its own Ulysses all-to-all and needs model.n_kv_heads={n_kv} to be "
                f"a multiple of parallel.ulysses.degree={p}; use torch or flash_2 (olmx then "
                f"replicates kv heads to {kv})",
            )
        return {"cp": p}

    def resolve(self, cfg: UlyssesConfig, ctx: Context) -> Contribution:
        """Tokens and heads per rank, and the all-to-all volume at the plan's compute dtype."""
        p, m, seq, world = _degree(cfg), ctx.run.model, ctx.run.data.seq_len, ctx.world
        n_kv = m.n_kv_heads or m.n_heads
        kv = replicated_kv_heads(n_kv, p)
        head_dim = m.d_model // m.n_heads
        micro = ctx.run.trainer.micro_batch_size
        elem = ctx.dtypes.compute_bytes
        vol = all_to_all_bytes(
            micro_seqs=micro, seq_len=seq, n_heads=m.n_heads, kv_heads=kv, head_dim=head_dim, degree=p, elem_bytes=elem
        )
        total = sum(vol.values())
        groups = world.size // p
        rows = [
            ("degree", f"{p} ranks per sequence, {groups} sequence group(s)"),
            (
                "tokens per rank",
                f"{seq:,} / {p} = {seq // p:,} per sequence, {micro * seq // p:,} per micro-batch of {micro}",
            ),
            (
                "heads per rank in attention",
                f"{m.n_heads // p} of {m.n_heads} query, {kv // p} of {kv} kv"
                + (f" (kv heads {n_kv} replicated x{kv // n_kv})" if kv != n_kv else ""),
            ),
            (
                "all-to-all per layer",
                f"{_mib(total)} per rank forward + the same backward "
                f"(q {_mib(vol['q'])}, k {_mib(vol['k'])}, v {_mib(vol['v'])}, "
                f"out {_mib(vol['out'])}; {elem}-byte activations; "
                f"{p - 1}/{p} leaves the rank)",
            ),
            (
                "all-to-all per micro-batch",
                f"{_mib(2 * total * m.n_layers)} per rank ({m.n_layers} layers, forward + backward)",
            ),
        ]
        kept = (m.d_model + 2 * (kv - n_kv) * head_dim) * elem * m.n_layers
        return Contribution(
            rows=rows,
            # per token and layer: the output back in sequence layout (the output projection's
            # input; attention keeps its own in head layout) and the kv heads added by replication
            activation_bytes_per_token=kept if p > 1 and ctx.run.trainer.activation_checkpointing != "full" else 0,
        )

    def apply_train_module(self, cfg: UlyssesConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]) -> Any:
        """Set OLMo-core's ``cp_config`` to its Ulysses style."""
        from olmo_core.train.train_module import TransformerContextParallelConfig

        train_module.cp_config = TransformerContextParallelConfig.ulysses(_degree(cfg))
        return train_module

    def apply_model(self, cfg: UlyssesConfig, model: Any, plan: Any) -> None:
        """Wrap every attention backend in the Ulysses all-to-all (before OLMo-core applies
        context parallelism, activation checkpointing, compile and FSDP/DDP)."""
        from olmx_plugins.parallel.ulysses_attention import apply_ulysses_attention

        apply_ulysses_attention(model)


ULYSSES = UlyssesStrategy()
