"""Time in the plan: FLOPs per token, the device's peak, and the step time and tokens/s at an
assumed utilisation (no torch).

FLOPs per token are OLMo-core 3.0.0's count (``Transformer.num_flops_per_token``, which its
``SpeedMonitorCallback`` reports MFU with), computed from the config: 6 per matmul parameter
(2 for the forward multiply-add, 4 for the backward; every parameter but the input embedding
and the blocks' two norms), plus attention's ``12 * n_heads * head_dim * pairs / seq_len`` per
layer, where ``pairs`` are the causal (query, key) pairs of a sequence, capped by the layer's
sliding window. Activation checkpointing adds what it recomputes in backward: ``full`` the
forward of every block (a third of the blocks' FLOPs), ``long_context`` the feed-forward's
(2 per feed-forward parameter), ``budget`` what torch's partitioner chooses to recompute
(:func:`budget_recompute`).

The step time is the FLOPs one device computes per optimizer step over its dense peak for the
plan's compute dtype (:data:`olmx.launch.devices.PEAK_FLOPS`) times ``trainer.assumed_mfu``.
Communication (gradient reduction, FSDP's gathers, Ulysses' all-to-all), data loading and the
optimizer step are not modelled; on CPUs there is no peak to use and the rows say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from olmx.config.schema import ModelConfig, RunConfig
from olmx.plan import BatchPlan, ParamCounts
from olmx.types import World


@dataclass(frozen=True)
class Flops:
    """FLOPs per trained token (forward and backward), as OLMo-core counts them, plus recompute."""

    #: 6 per matmul parameter.
    params: int
    #: The attention scores and their product with the values.
    attention: int
    #: What activation checkpointing recomputes in backward.
    recompute: int

    @property
    def model(self) -> int:
        """OLMo-core's ``num_flops_per_token`` (what MFU is measured against)."""
        return self.params + self.attention

    @property
    def total(self) -> int:
        """What a device computes per token."""
        return self.model + self.recompute


def causal_pairs(seq_len: int, window: int | None = None) -> int:
    """Attended (query, key) pairs of one causal sequence, each query seeing at most ``window``
    keys (OLMo-core's ``_causal_attention_positions``)."""
    if window is None or window >= seq_len:
        return seq_len * (seq_len + 1) // 2
    return window * (window + 1) // 2 + (seq_len - window) * window


def layer_windows(model: ModelConfig) -> list[int | None]:
    """Each block's sliding window (None: full attention): ``model.sliding_window`` cycled over
    the blocks, the last block always full (as olmx builds OLMo-core's config)."""
    pattern = model.sliding_window or []
    out: list[int | None] = []
    for i in range(model.n_layers):
        w = pattern[i % len(pattern)] if pattern and i < model.n_layers - 1 else -1
        out.append(None if w == -1 else w)
    return out


#: ``activation_checkpointing=budget``: the budget at and above which torch's partitioner
#: recomputes no matmul, only element-wise work and the attention kernel (which has no FLOP
#: count on CPUs, nor as flash-attn's custom op, so it costs the partitioner nothing); below
#: it, the share of the blocks' forward matmul FLOPs recomputed grows to all of them at 0.
#: Counted from the partitioned backward graphs of compiled blocks at OLMo 3 7B's and 32B's
#: width ratios (``benchmarks/compiled_activations.py``): no matmul recomputed at 0.6-0.9 (the
#: attention from 0.7 down); at 0.5 12% (32B) and 17% (7B) of them, at 0.4 29% and 25%, at 0.3
#: 40% and 45%, at 0.2 58% and 55% (this bound: 17%, 33%, 50%, 67%).
BUDGET_NO_MATMUL_RECOMPUTE = 0.6


def budget_recompute(block_matmul: int, attention: int, budget: float) -> int:
    """FLOPs per token ``activation_checkpointing=budget`` recomputes, from the blocks' forward
    matmul and attention FLOPs: the attention's forward below a budget of 1, and
    ``1 - budget / BUDGET_NO_MATMUL_RECOMPUTE`` of the matmuls (a bound above what was counted,
    :data:`BUDGET_NO_MATMUL_RECOMPUTE`)."""
    if budget >= 1:
        return 0
    share = max(0.0, 1 - budget / BUDGET_NO_MATMUL_RECOMPUTE)
    return attention + int(share * block_matmul)


def flops_per_token(
    model: ModelConfig,
    *,
    params: ParamCounts,
    seq_len: int,
    activation_checkpointing: str | None,
    memory_budget: float = 1.0,
) -> Flops:
    """FLOPs per token of ``model`` with ``params`` (the plan's counts: the layers' active
    parameters included) at ``seq_len`` (see the module docstring); ``memory_budget``:
    ``trainer.activation_memory_budget`` (read under ``activation_checkpointing=budget``)."""
    d, n = model.d_model, model.n_layers
    head_dim = d // model.n_heads
    matmul = params.active - params.embedding - 2 * d * n  # the blocks' two norms are not matmuls
    attention = sum(12 * model.n_heads * head_dim * causal_pairs(seq_len, w) // seq_len for w in layer_windows(model))
    vocab = params.embedding // d
    head = 6 * (d + d * vocab)  # the output layer (its norm and projection) is outside every block
    recompute = 0
    if activation_checkpointing == "full":  # every block's forward again: a third of its FLOPs
        recompute = (6 * matmul - head + attention) // 3
    elif activation_checkpointing == "long_context":  # the feed-forward's forward again
        recompute = 2 * 3 * d * model.hidden_size * n
    elif activation_checkpointing == "budget":  # what the partitioner recomputes (a third: forward)
        recompute = budget_recompute((6 * matmul - head) // 3, attention // 3, memory_budget)
    return Flops(params=6 * matmul, attention=attention, recompute=recompute)


@dataclass(frozen=True)
class StepTime:
    """The plan's time estimate."""

    flops: Flops
    #: Dense peak FLOP/s of one device in the compute dtype (None: unknown).
    peak: float | None
    #: Seconds per optimizer step (None where the peak is unknown).
    seconds: float | None
    tokens_per_step: int
    world_size: int
    #: The share of the step the devices idle (a pipeline's bubble), included in ``seconds``.
    idle: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second over the whole world."""
        return None if not self.seconds else self.tokens_per_step / self.seconds


def estimate(
    run: RunConfig, world: World, params: ParamCounts, batch: BatchPlan, compute_dtype: str, *, idle: float = 0.0
) -> StepTime:
    """The step time of the plan at ``run.trainer.assumed_mfu``, stretched by ``1 / (1 - idle)``
    where the devices idle that share of a step (a pipeline's bubble)."""
    from olmx.hardware import peak_flops

    flops = flops_per_token(
        run.model,
        params=params,
        seq_len=batch.seq_len,
        activation_checkpointing=run.trainer.activation_checkpointing,
        memory_budget=run.trainer.activation_memory_budget,
    )
    peak = peak_flops(world.device_name, compute_dtype) if world.device == "cuda" else None
    per_device = flops.total * batch.global_tokens / world.size
    seconds = per_device / (peak * run.trainer.assumed_mfu) / (1 - idle) if peak else None
    return StepTime(flops, peak, seconds, batch.global_tokens, world.size, idle)


def _g(n: float) -> str:
    return f"{n / 1e9:,.3g} G" if n >= 1e8 else f"{n / 1e6:,.3g} M"


def rows(est: StepTime, run: RunConfig, world: World, compute_dtype: str) -> list[tuple[str, str]]:
    """The plan's ``time`` section."""
    f, ac = est.flops, str(run.trainer.activation_checkpointing)
    if ac == "budget":
        ac = f"budget, trainer.activation_memory_budget={run.trainer.activation_memory_budget:g}"
    recompute = f" + recompute {_g(f.recompute)} (activation_checkpointing={ac})" if f.recompute else ""
    out = [
        (
            "FLOPs per token",
            f"{_g(f.total)} = {_g(f.params)} (6 per matmul parameter) + attention {_g(f.attention)} at "
            f"data.seq_len={run.data.seq_len:,}{recompute}; OLMo-core's count without recompute: {_g(f.model)}",
        )
    ]
    if est.peak is None or est.seconds is None:
        why = "no vendor peak for CPUs" if world.device != "cuda" else f"{world.device_name} is not in olmx's table"
        out.append(("device peak", f"unknown ({why}): no step-time estimate"))
        return out
    per_device = est.tokens_per_step // est.world_size
    total = est.tokens_per_s or 0.0
    out += [
        ("device peak", f"{est.peak / 1e12:,.0f} TFLOP/s dense {compute_dtype} ({world.device_name})"),
        (
            "step time",
            f"{est.seconds:,.3g} s at trainer.assumed_mfu={run.trainer.assumed_mfu:g}"
            + (f" with {est.idle:.0%} of it idle (pipeline bubble)" if est.idle else "")
            + f": {est.tokens_per_step:,} tokens per step, {per_device:,} per device",
        ),
        ("tokens/s", f"{total / est.world_size:,.0f} per device, {total:,.0f} in total"),
        ("not modelled", "communication (gradient reduction, FSDP gathers, all-to-all), data loading, optimizer step"),
    ]
    return out
