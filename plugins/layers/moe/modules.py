"""Portable mixture-of-experts feed-forward layer in pure PyTorch (runs on CPU, GPU, gloo, NCCL).

Method
------
For the ``N`` tokens ``x`` (``[N, d]``) of a forward call:

1. **Router.** ``logits = x W_r^T`` in float32 (``W_r``: ``[E, d]``). ``scores`` is
   ``softmax(logits)`` or ``sigmoid(logits) + 1e-7``. Each token picks the ``top_k`` experts by
   score; with aux-loss-free balancing (DeepSeek-V3, arXiv 2412.19437 §2.1.2) the choice is made
   on ``scores + b`` while the combine weights stay the unbiased ``scores``. The bias ``b`` is a
   buffer, changed only outside autograd by :meth:`MoERouter.update_expert_bias`:
   ``b_e += gamma * sign(mean(c) - c_e)`` with ``c`` the token counts of the batch (summed over
   all ranks). Optionally the ``top_k`` weights are divided by their ``p``-norm (``p = 1``
   renormalises them to sum to one).
2. **Dispatch (index-based grouping).** The ``N * top_k`` (token, expert) assignments are sorted
   by expert with a stable sort, so within one expert tokens keep their order. With a capacity
   factor ``cf`` each expert keeps at most ``ceil(cf * top_k * N / E)`` assignments, the earliest
   tokens first; the rest are dropped (their share of the output is zero, the residual stream
   still carries the token) and counted. Without ``cf`` the layer is dropless.
3. **Experts.** Gated SwiGLU as in OLMo-core's ``FeedForward``:
   ``y_e(x) = (silu(x W1_e) * (x W3_e)) W2_e`` with ``W1, W3: [E, d, h]`` and ``W2: [E, h, d]``,
   evaluated for all experts at once with ``torch.nn.functional.grouped_mm`` on the sorted rows
   (it exists in the torch 2.13 CPU build for float32/bfloat16/float16); other dtypes use a loop
   over experts. Under expert parallelism the sorted rows travel to the experts' ranks and back
   (``expert_parallel.py``).
4. **Combine.** ``out_t = sum_j w_tj * y_{e_tj}(x_t)`` (``index_add``), plus the optional shared
   expert ``s(x)``: ``out + s`` ("sum", DeepSeek-MoE) or ``s/(k+1) + out*k/(k+1)``
   ("olmo_core_v1", the mixing of OLMo-core's v1 ``shared_mlp``).

Auxiliary losses follow OLMo-core v1 (``olmo_core/nn/moe/loss.py``, ``local_batch`` granularity)
so values carry over:

* load balancing (Switch Transformer, arXiv 2101.03961, eq. 4):
  ``(E / k) * sum_e c_e * mean_t(p_te) / D``, where ``c`` counts assignments before capacity
  dropping, ``p`` are the scores (sigmoid scores renormalised per token) and ``D`` the number of
  tokens (``N`` by default; OLMo-core passes the rank's token count for the whole batch so that
  the micro-batch terms add up). With ``D = N`` this is ``E * sum_e f_e P_e`` with
  ``f_e = c_e / (N k)`` and ``P_e = mean_t p_te``; it is 1 for perfectly uniform routing.
* router z-loss (ST-MoE, arXiv 2202.08906, eq. 5): ``sum_t logsumexp(logits_t)^2 / D``.

Both are multiplied by their weights and attached to the layer output with
``olmo_core.ops.attach_auxiliary_loss`` (their gradient flows in the backward pass, the value
does not appear in the returned loss).

Initialisation is deterministic and independent of how the parameters are sharded: every row of
every parameter is drawn (truncated normal, ``std = init_std``, cut at 3 std) from its own
generator seeded by (``init_seed``, layer, parameter, row). An expert-parallel or FSDP-sharded
model therefore starts from exactly the global tensors of the unsharded one, and no rank ever
materialises experts it does not hold.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.ops import attach_auxiliary_loss
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = [
    "Gating",
    "SharedExpertMixing",
    "RouterOutput",
    "MoERouter",
    "MoEExperts",
    "SharedExpert",
    "MoEFeedForward",
    "grouped_matmul",
    "sort_by_expert",
    "count_per_expert",
    "seeded_rows",
    "autocast_dtype",
    "load_balancing_loss",
    "router_z_loss",
    "expert_capacity",
    "moe_layers",
]

Gating = Literal["softmax", "sigmoid"]
"""How router logits become scores: ``softmax`` over experts, or an independent ``sigmoid``."""

SharedExpertMixing = Literal["sum", "olmo_core_v1"]
"""How the shared expert joins the routed output (see the module docstring)."""

ExpertDispatch = Callable[[torch.Tensor, torch.Tensor, "MoEExperts"], torch.Tensor]
"""``(rows sorted by global expert, rows per global expert, experts) -> expert outputs``."""

_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------------------------
# Pure functions


def load_balancing_loss(
    scores: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    *,
    top_k: int,
    loss_div_factor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Switch-Transformer load-balancing loss, normalised like OLMo-core v1.

    :param scores: Per-token expert probabilities, ``[N, E]`` (rows sum to one).
    :param tokens_per_expert: Assignments per expert before capacity dropping, ``[E]``.
    :param top_k: Experts per token.
    :param loss_div_factor: Token count ``D`` to divide by; ``N`` when ``None``.
    """
    num_tokens, num_experts = scores.shape
    div = num_tokens if loss_div_factor is None else loss_div_factor
    counts = tokens_per_expert.to(scores.dtype)
    return (num_experts / top_k) * torch.dot(counts, scores.mean(dim=0)) / div


def router_z_loss(logits: torch.Tensor, *, loss_div_factor: torch.Tensor | float | None = None) -> torch.Tensor:
    """Router z-loss ``sum_t logsumexp(logits_t)^2 / D`` (``D = N`` when ``None``)."""
    div = logits.shape[0] if loss_div_factor is None else loss_div_factor
    return torch.logsumexp(logits, dim=-1).square().sum() / div


def expert_capacity(num_tokens: int, *, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Assignments each expert accepts from ``num_tokens`` local tokens: ``ceil(cf * k * N / E)``."""
    return math.ceil(capacity_factor * top_k * num_tokens / num_experts)


@torch.compiler.disable
def count_per_expert(expert_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Assignments per expert (``[num_experts]``, int64) of the flat ``expert_ids``: what
    ``torch.bincount(expert_ids, minlength=num_experts)`` gives, without its host sync (on CUDA
    bincount reads the largest id back to size its output). Left to eager under
    ``torch.compile`` (a graph break, where bincount's data-dependent size made one too): traced,
    torch 2.13's AOT autograd fails the compiled MoE block with "output spec mismatch" once its
    shapes are dynamic (tests/worker/test_compile.py)."""
    ones = torch.ones_like(expert_ids, dtype=torch.long)
    return torch.zeros(num_experts, dtype=torch.long, device=expert_ids.device).scatter_add_(0, expert_ids, ones)


def sort_by_expert(
    expert_indices: torch.Tensor, num_experts: int, *, capacity: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the (token, expert) assignments by expert.

    :param expert_indices: ``[N, k]`` expert ids.
    :param capacity: Keep at most this many assignments per expert (earliest tokens first);
        ``None`` keeps all (dropless).
    :returns: ``order`` (indices into the flattened ``[N * k]`` assignments, grouped by expert,
        token order within an expert), ``tokens_per_expert`` (``[E]``, after dropping) and the
        number of dropped assignments (a 0-d tensor).
    """
    flat = expert_indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = count_per_expert(flat, num_experts)
    if capacity is None:
        return order, counts, torch.zeros((), dtype=torch.long, device=flat.device)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    keep = position < capacity
    return order[keep], counts.clamp(max=capacity), (~keep).sum()


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast`` computes matmuls in on ``device_type`` (None: autocast is off)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, tokens_per_group: torch.Tensor) -> torch.Tensor:
    """Multiply consecutive row groups of ``x`` (``[M, K]``) by their own ``w[g]`` (``[G, K, N]``).

    Uses ``torch.nn.functional.grouped_mm`` where it applies (float32/bfloat16/float16, equal
    dtypes, contiguous operands whose rows are multiples of 16 bytes; bfloat16 only under
    ``torch.compile``), else a loop over groups (a graph break: the group sizes are data).
    Every group touches its weight, so empty groups still get a (zero) gradient.
    """
    if _grouped_mm_applies(x, w):
        offs = torch.cumsum(tokens_per_group, 0).to(device=x.device, dtype=torch.int32)
        return F.grouped_mm(x, w, offs=offs)
    chunks = x.split(tokens_per_group.tolist())
    return torch.cat([chunk @ w[g] for g, chunk in enumerate(chunks)])


def _grouped_mm_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    if not hasattr(F, "grouped_mm") or x.dtype not in _GROUPED_MM_DTYPES or x.dtype != w.dtype:
        return False
    if x.dtype != torch.bfloat16 and torch.compiler.is_compiling():
        return False  # torch 2.13's meta kernel, which torch.compile traces with, takes only bfloat16
    size = x.element_size()
    return x.is_contiguous() and w.is_contiguous() and (x.shape[1] * size) % 16 == 0 and (w.shape[2] * size) % 16 == 0


# ---------------------------------------------------------------------------------------------
# Deterministic, sharding-independent initialisation


def _local_row_ids(p: torch.Tensor) -> torch.Tensor:
    """Global dim-0 indices of the rows of ``p`` held by this rank (all rows if not a DTensor)."""
    if not isinstance(p, DTensor):
        return torch.arange(p.shape[0])
    ids = torch.arange(p.shape[0], dtype=torch.float64).view(-1, *([1] * (p.ndim - 1)))
    local = distribute_tensor(ids, p.device_mesh, p.placements, src_data_rank=None).to_local()
    return local.reshape(-1).long()


def seeded_rows(seed_key: str, rows: Iterable[int], shape: Sequence[int], *, std: float) -> torch.Tensor:
    """Rows ``rows`` (dim-0 indices) of the parameter keyed by ``seed_key`` as the seeded init
    draws them: row ``r`` is a truncated normal of ``shape`` (``std``, cut at 3 std) from a
    generator seeded with (``crc32(seed_key)``, ``r``). float32 on the CPU, ``[len(rows), *shape]``."""
    base = zlib.crc32(seed_key.encode()) << 24
    gen = torch.Generator()
    out = []
    for row in rows:
        gen.manual_seed(base + row)
        t = torch.empty(tuple(shape), dtype=torch.float32)
        out.append(nn.init.trunc_normal_(t, std=std, a=-3 * std, b=3 * std, generator=gen))
    return torch.stack(out) if out else torch.empty(0, *shape)


@torch.no_grad()
def _seeded_trunc_normal_(p: torch.Tensor, *, std: float, seed_key: str) -> None:
    """Fill ``p`` (plain or DTensor) row by row from per-row generators keyed by ``seed_key``."""
    local = p.to_local() if isinstance(p, DTensor) else p
    if local.numel() == 0 or local.is_meta:
        return
    local.copy_(seeded_rows(seed_key, _local_row_ids(p).tolist(), local.shape[1:], std=std).to(local.dtype))


class _ScaleGrad(torch.autograd.Function):
    """Identity in the forward pass; multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


# ---------------------------------------------------------------------------------------------
# Modules


@dataclass
class RouterOutput:
    """What the router decided for ``N`` tokens."""

    expert_weights: torch.Tensor
    """Combine weights of the chosen experts, ``[N, top_k]``, float32."""
    expert_indices: torch.Tensor
    """Chosen expert ids, ``[N, top_k]``, int64."""
    logits: torch.Tensor
    """Router logits, ``[N, E]``, float32."""
    scores: torch.Tensor
    """Softmax or sigmoid scores, ``[N, E]``, float32."""
    tokens_per_expert: torch.Tensor
    """Assignments per expert (before capacity dropping), ``[E]``, int64."""


class MoERouter(nn.Module):
    """Linear top-k router with softmax or sigmoid gating and optional aux-loss-free bias.

    Parameter ``weight``: ``[num_experts, d_model]``. Buffer ``score_bias`` (``[num_experts]``,
    saved in checkpoints) exists only when ``bias_gamma`` is set.
    """

    def __init__(
        self,
        d_model: int,
        num_experts: int,
        *,
        top_k: int = 1,
        gating: Gating = "softmax",
        normalize_expert_weights: float | None = None,
        bias_gamma: float | None = None,
        init_std: float = 0.02,
        seed_key: str = "router",
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__()
        if gating not in ("softmax", "sigmoid"):
            raise ValueError(f"gating must be 'softmax' or 'sigmoid', got {gating!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
        if bias_gamma is not None and bias_gamma <= 0:
            raise ValueError(f"bias_gamma must be positive, got {bias_gamma}")
        self.d_model = d_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.gating = gating
        self.normalize_expert_weights = normalize_expert_weights
        self.bias_gamma = bias_gamma
        self.init_std = init_std
        self.seed_key = seed_key
        self.group: dist.ProcessGroup | None = None
        """Group over which :meth:`update_expert_bias` sums token counts (default: all ranks)."""
        self.weight = nn.Parameter(torch.empty(num_experts, d_model, dtype=dtype, device=init_device))
        self.score_bias: torch.Tensor | None
        if bias_gamma is not None:
            self.register_buffer("score_bias", torch.zeros(num_experts, device=init_device))
        else:
            self.score_bias = None
        # Plain attribute, not a buffer: counts must stay exact (``model.to(bfloat16)`` would
        # cast a float buffer) and must not be checkpointed or managed by FSDP.
        self.bias_tokens_per_expert: torch.Tensor | None = None
        """Assignments per expert (int64) since the last :meth:`update_expert_bias`."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Seeded truncated-normal weight; zero bias and counters."""
        _seeded_trunc_normal_(self.weight, std=self.init_std, seed_key=f"{self.seed_key}.weight")
        if self.score_bias is not None and not self.score_bias.is_meta:
            self.score_bias.zero_()
        self.bias_tokens_per_expert = None

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """Route ``x`` (``[N, d_model]``)."""
        weight = self.weight.to_local() if isinstance(self.weight, DTensor) else self.weight
        logits = F.linear(x.float(), weight.float())
        if self.gating == "softmax":
            scores = logits.softmax(dim=-1)
        else:
            scores = torch.sigmoid(logits) + 1e-7  # as OLMo-core: keeps the renormalisation finite
        if self.score_bias is None:
            expert_weights, expert_indices = torch.topk(scores, self.top_k, dim=-1)
        else:
            with torch.no_grad():
                _, expert_indices = torch.topk(scores + self.score_bias, self.top_k, dim=-1)
            expert_weights = scores.gather(-1, expert_indices)
        if self.normalize_expert_weights is not None:
            norm = expert_weights.norm(p=self.normalize_expert_weights, dim=-1, keepdim=True)
            expert_weights = expert_weights / norm
        accumulate = self.score_bias is not None and self.training and torch.is_grad_enabled()
        with torch.no_grad():
            tokens_per_expert = count_per_expert(expert_indices.reshape(-1), self.num_experts)
            if accumulate:
                prev = self.bias_tokens_per_expert
                self.bias_tokens_per_expert = tokens_per_expert if prev is None else prev + tokens_per_expert
        return RouterOutput(expert_weights, expert_indices, logits, scores, tokens_per_expert)

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        """Apply the aux-loss-free bias update for the counts seen since the last call, then reset.

        Call once per optimizer step, after the last backward of the batch, on every rank (it
        all-reduces the counts over :attr:`group` when torch.distributed is initialised).
        """
        if self.score_bias is None:
            return
        counts = self.bias_tokens_per_expert
        if counts is None:  # every rank must join the all-reduce, even without tokens
            counts = torch.zeros(self.num_experts, dtype=torch.long, device=self.score_bias.device)
        counts = counts.clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counts, group=self.group)
        counts = counts.float()
        self.score_bias += self.bias_gamma * (counts.mean() - counts).sign()
        self.bias_tokens_per_expert = None


class MoEExperts(nn.Module):
    """``num_experts`` gated SwiGLU experts stored as batched tensors.

    Parameters: ``w1`` and ``w3`` ``[E, d_model, hidden_size]``, ``w2`` ``[E, hidden_size,
    d_model]``; expert ``e`` computes ``(silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]``. Under expert
    parallelism they are DTensors sharded on dim 0 (each rank holds ``E / ep`` experts).
    """

    def __init__(
        self,
        num_experts: int,
        d_model: int,
        hidden_size: int,
        *,
        init_std: float = 0.02,
        seed_key: str = "experts",
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__()
        self.num_experts = num_experts
        self.d_model = d_model
        self.hidden_size = hidden_size
        self.init_std = init_std
        self.seed_key = seed_key
        self.grad_scale = 1.0
        """Multiplier on the weight gradients (``1 / ep_degree`` under expert parallelism)."""
        kw = dict(dtype=dtype, device=init_device)
        self.w1 = nn.Parameter(torch.empty(num_experts, d_model, hidden_size, **kw))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, d_model, **kw))
        self.w3 = nn.Parameter(torch.empty(num_experts, d_model, hidden_size, **kw))
        self.reset_parameters()

    @property
    def num_local_experts(self) -> int:
        """Experts held by this rank."""
        w1 = self.w1
        return w1.to_local().shape[0] if isinstance(w1, DTensor) else w1.shape[0]

    def reset_parameters(self) -> None:
        """Seeded truncated-normal init, one generator per (parameter, expert)."""
        for name in ("w1", "w2", "w3"):
            _seeded_trunc_normal_(getattr(self, name), std=self.init_std, seed_key=f"{self.seed_key}.{name}")

    def _local_weight(self, w: torch.Tensor) -> torch.Tensor:
        if isinstance(w, DTensor):
            w = w.to_local()
        if self.grad_scale != 1.0:
            w = _ScaleGrad.apply(w, self.grad_scale)
        return w

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """Run rows ``x`` (``[M, d_model]``, grouped by local expert) through their experts.

        :param tokens_per_expert: Rows per local expert, ``[num_local_experts]``, summing to ``M``.
        """
        w1, w2, w3 = (self._local_weight(w) for w in (self.w1, self.w2, self.w3))
        dtype = autocast_dtype(x.device.type)
        if dtype is not None:
            # Autocast casts nn.Linear/matmul operands but not grouped_mm's: do it here, so that
            # experts compute in the dtype the dense layers do (grouped_mm's fast CUDA path needs
            # 16-bit operands); weight gradients flow back to the float32 parameters.
            w1, w2, w3 = w1.to(dtype), w2.to(dtype), w3.to(dtype)
        x = x.to(w1.dtype)
        h = F.silu(grouped_matmul(x, w1, tokens_per_expert)) * grouped_matmul(x, w3, tokens_per_expert)
        return grouped_matmul(h, w2, tokens_per_expert)


class _SeededLinear(nn.Linear):
    """``nn.Linear`` without bias whose ``reset_parameters`` uses the seeded row-wise init."""

    def __init__(self, in_features: int, out_features: int, *, init_std: float, seed_key: str, **kw):
        self.init_std = init_std
        self.seed_key = seed_key
        super().__init__(in_features, out_features, bias=False, **kw)

    def reset_parameters(self) -> None:
        _seeded_trunc_normal_(self.weight, std=self.init_std, seed_key=f"{self.seed_key}.weight")


class SharedExpert(nn.Module):
    """Always-on SwiGLU expert, ``w2(silu(w1 x) * w3 x)``; names match OLMo-core ``FeedForward``."""

    def __init__(
        self,
        d_model: int,
        hidden_size: int,
        *,
        init_std: float = 0.02,
        seed_key: str = "shared",
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__()
        kw = dict(init_std=init_std, dtype=dtype, device=init_device)
        self.w1 = _SeededLinear(d_model, hidden_size, seed_key=f"{seed_key}.w1", **kw)
        self.w2 = _SeededLinear(hidden_size, d_model, seed_key=f"{seed_key}.w2", **kw)
        self.w3 = _SeededLinear(d_model, hidden_size, seed_key=f"{seed_key}.w3", **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the expert to ``x`` (``[..., d_model]``)."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoEFeedForward(nn.Module):
    """Router + routed experts (+ optional shared expert) with aux losses; drop-in FFN.

    ``forward(x, loss_div_factor=...)`` maps ``[..., d_model]`` to the same shape. Expert
    parallelism is switched on from outside by ``expert_parallel.apply_expert_parallel``.
    """

    def __init__(
        self,
        d_model: int,
        *,
        num_experts: int,
        hidden_size: int,
        top_k: int = 1,
        gating: Gating = "softmax",
        normalize_expert_weights: float | None = None,
        bias_gamma: float | None = None,
        shared_hidden_size: int | None = None,
        shared_expert_mixing: SharedExpertMixing = "sum",
        capacity_factor: float | None = None,
        lb_loss_weight: float | None = None,
        z_loss_weight: float | None = None,
        init_std: float = 0.02,
        seed_key: str = "moe",
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__()
        if shared_expert_mixing not in ("sum", "olmo_core_v1"):
            raise ValueError(f"shared_expert_mixing must be 'sum' or 'olmo_core_v1', got {shared_expert_mixing!r}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive, got {capacity_factor}")
        self.d_model = d_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.shared_expert_mixing = shared_expert_mixing
        self.lb_loss_weight = lb_loss_weight
        self.z_loss_weight = z_loss_weight
        self.cp_degree = 1
        """Context-parallel degree; the block sets it in ``apply_cp`` (divides ``loss_div_factor``)."""
        self.dispatch: ExpertDispatch | None = None
        """Expert-parallel dispatcher set by ``apply_expert_parallel``; ``None`` runs locally."""
        self.router = MoERouter(
            d_model,
            num_experts,
            top_k=top_k,
            gating=gating,
            normalize_expert_weights=normalize_expert_weights,
            bias_gamma=bias_gamma,
            init_std=init_std,
            seed_key=f"{seed_key}.router",
            dtype=dtype,
            init_device=init_device,
        )
        self.experts = MoEExperts(
            num_experts,
            d_model,
            hidden_size,
            init_std=init_std,
            seed_key=f"{seed_key}.experts",
            dtype=dtype,
            init_device=init_device,
        )
        self.shared_expert = (
            None
            if shared_hidden_size is None
            else SharedExpert(
                d_model,
                shared_hidden_size,
                init_std=init_std,
                seed_key=f"{seed_key}.shared_expert",
                dtype=dtype,
                init_device=init_device,
            )
        )
        # Metric accumulators since the last ``compute_metrics(reset=True)``; plain attributes
        # (not buffers) so that dtype casts, checkpoints and FSDP leave them alone.
        self._metrics: dict[str, torch.Tensor] = {}
        self.last_aux_losses: dict[str, torch.Tensor] = {}
        """Unweighted aux losses of the latest training forward (``lb_loss``, ``z_loss``), detached."""

    def reset_parameters(self) -> None:
        """Clear the metric accumulators (the submodules reset the parameters)."""
        self.reset_metrics()

    def reset_metrics(self) -> None:
        """Clear the metric accumulators."""
        self._metrics = {}

    def _accumulate(self, name: str, value: torch.Tensor) -> None:
        prev = self._metrics.get(name)
        self._metrics[name] = value.detach() if prev is None else prev + value.detach()

    @property
    def ep_enabled(self) -> bool:
        """Whether experts are sharded over an expert-parallel group."""
        return self.dispatch is not None

    def capacity(self, num_tokens: int) -> int | None:
        """Per-expert capacity for ``num_tokens`` local tokens, ``None`` when dropless."""
        if self.capacity_factor is None:
            return None
        return expert_capacity(
            num_tokens, num_experts=self.num_experts, top_k=self.top_k, capacity_factor=self.capacity_factor
        )

    def forward(self, x: torch.Tensor, *, loss_div_factor: torch.Tensor | float | None = None) -> torch.Tensor:
        """Apply the MoE to ``x`` (``[..., d_model]``).

        :param loss_div_factor: Token count the aux losses are divided by (OLMo-core passes the
            rank's number of loss tokens in the whole batch); defaults to this call's tokens.
        """
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        route = self.router(x2)
        order, tokens_per_expert, dropped = sort_by_expert(
            route.expert_indices, self.num_experts, capacity=self.capacity(x2.shape[0])
        )
        token_idx = order // self.top_k
        rows = x2[token_idx]
        if self.dispatch is None:
            out_rows = self.experts(rows, tokens_per_expert)
        else:
            out_rows = self.dispatch(rows, tokens_per_expert, self.experts)
        out_rows = out_rows * route.expert_weights.reshape(-1)[order].unsqueeze(-1).to(out_rows.dtype)
        out = out_rows.new_zeros(x2.shape[0], shape[-1]).index_add(0, token_idx, out_rows)

        if self.shared_expert is not None:
            shared = self.shared_expert(x2).to(out.dtype)
            if self.shared_expert_mixing == "sum":
                out = out + shared
            else:
                out = shared / (self.top_k + 1) + out * (self.top_k / (self.top_k + 1))

        if self.training and torch.is_grad_enabled():
            aux = self._aux_loss(route, loss_div_factor)
            if aux is not None:
                out = attach_auxiliary_loss(out, aux)
            self._accumulate("tokens_per_expert", route.tokens_per_expert)
            self._accumulate("dropped", dropped)
        return out.view(shape).to(x.dtype)

    def _aux_loss(self, route: RouterOutput, loss_div_factor) -> torch.Tensor | None:
        if loss_div_factor is not None and self.cp_degree > 1:
            loss_div_factor = loss_div_factor / self.cp_degree
        total: torch.Tensor | None = None
        self.last_aux_losses = {}
        if self.lb_loss_weight is not None:
            scores = route.scores
            if self.router.gating == "sigmoid":
                scores = scores / scores.sum(dim=-1, keepdim=True)
            lb = load_balancing_loss(scores, route.tokens_per_expert, top_k=self.top_k, loss_div_factor=loss_div_factor)
            self.last_aux_losses["lb_loss"] = lb.detach()
            self._accumulate("lb_loss", lb)
            total = self.lb_loss_weight * lb
        if self.z_loss_weight is not None:
            z = router_z_loss(route.logits, loss_div_factor=loss_div_factor)
            self.last_aux_losses["z_loss"] = z.detach()
            self._accumulate("z_loss", z)
            total = self.z_loss_weight * z if total is None else total + self.z_loss_weight * z
        return total

    @torch.no_grad()
    def compute_metrics(self, *, reset: bool = True) -> dict[str, torch.Tensor]:
        """Rank-local metrics of the training forwards since the last reset (``{}`` if none).

        ``load_imbalance`` (max / mean tokens per expert; reduce with max), ``dropped_fraction``
        (dropped / routed assignments; mean), ``lb_loss`` and ``z_loss`` (unweighted sums of the
        per-call losses, i.e. the batch loss when ``loss_div_factor`` is the batch token count;
        mean), ``tokens_per_expert`` (sum).
        """
        m = self._metrics
        if "tokens_per_expert" not in m:
            return {}
        counts = m["tokens_per_expert"].float()
        out = {
            "load_imbalance": counts.max() / counts.mean().clamp(min=1e-9),
            "dropped_fraction": m["dropped"].float() / counts.sum().clamp(min=1),
            "tokens_per_expert": counts,
        }
        out.update({k: m[k] for k in ("lb_loss", "z_loss") if k in m})
        if reset:
            self.reset_metrics()
        return out

    def update_expert_bias(self) -> None:
        """Aux-loss-free bias step for this layer (see :meth:`MoERouter.update_expert_bias`)."""
        self.router.update_expert_bias()

    def num_flops_per_token(self) -> int:
        """Idealised training flops per token (6 per multiply-add): router + k experts + shared."""
        flops = 6 * self.num_experts * self.d_model
        flops += 6 * 3 * self.d_model * self.experts.hidden_size * self.top_k
        if self.shared_expert is not None:
            flops += 6 * 3 * self.d_model * self.shared_expert.w1.out_features
        return flops


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """All :class:`MoEFeedForward` layers in ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]
