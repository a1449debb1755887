"""The Engram layer for one block: lookup, context-aware gate, short causal convolution.

Method (arXiv 2601.07372 §2.2-2.3, eq. 2-5, and ``Engram`` in the official
deepseek-ai/Engram ``engram_demo_v1.py``, for a single residual branch, M = 1):

1. ``e_t``: the rows of all ``(N-1)*K`` heads, concatenated (not averaged), width
   ``d_mem = (N-1) * n_embed_per_ngram``.
2. Gate: ``s_t = RMSNorm(W_K e_t) . RMSNorm(h_t) / sqrt(d)``, then the signed square root
   ``sign(s) sqrt(max(|s|, 1e-6))`` (in the official code, not in the paper), then
   ``alpha_t = sigmoid(.)``, a scalar per token in (0, 1).
3. Value: ``v_t = alpha_t W_V e_t``.
4. Output: ``Y = v + SiLU(Conv1d(RMSNorm(v)))``, a causal depthwise convolution with kernel
   ``kernel_size`` and dilation ``N``, without bias. Its weight starts at zero (the paper;
   the demo does not) unless ``zero_init_conv=False``, so at initialisation ``Y = v``.

The block adds ``Y`` to the residual stream before attention. An output at position ``t``
depends on tokens ``t - (kernel_size - 1) * N - (N - 1) .. t`` only: a receptive field of
``(kernel_size - 1) * N + N`` tokens (12 with the defaults).

Scale at initialisation. The demo's residual stream and its tables are both N(0, 1); with
``nn.Linear``'s default projections (weight variance ``1 / (3 d_mem)``, so ``W_V e`` has RMS
``1/sqrt(3)``) and a gate of RMS ~0.54 (the score is ~N(0, 1)), ``Y`` has RMS ~0.31 of the
residual it is added to (measured 0.314 with the demo's math and a zero convolution; 0.45
with the demo's default convolution init). ``table_init_std`` scales the tables and the
projection biases together, which scales ``W e + b`` and so ``Y`` (the gate's RMSNorms do
not see the scale): with the tables at the host embeddings' std (olmx's default), ``Y`` is
again ~0.31 of OLMo-core's token embeddings (std 0.02; measured 0.316 at block 0 of the tiny
model, 0.22 at block 1, whose residual block 0 has grown), not ~15x them.

The gate's RMSNorms use the float32 epsilon (~1.2e-7), as the demo's ``nn.RMSNorm()`` does:
a fixed 1e-5 would weigh on OLMo-core's small hidden states (mean square ~4e-4 at init, and
less for keys of small tables), the convolution's keeps the demo's 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .sharding import EngramTable, TableSharding

__all__ = ["Engram"]


class _Projection(nn.Linear):
    """``nn.Linear`` whose bias starts at the default initialisation times ``bias_scale`` (in
    ``reset_parameters``, which OLMo-core calls on every module after its parent's)."""

    def __init__(self, in_features: int, out_features: int, *, bias_scale: float, device: Any = None):
        self.bias_scale = float(bias_scale)  # read by reset_parameters, which __init__ calls
        super().__init__(in_features, out_features, device=device)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.bias is not None and self.bias_scale != 1.0 and self.bias.device.type != "meta":
            with torch.no_grad():
                self.bias.mul_(self.bias_scale)


class Engram(nn.Module):
    """Engram conditional memory for one layer (hidden states ``[B, T, d_model]``).

    :param d_model: Width of the residual stream.
    :param table_sizes: The layer's ``(N-1)*K`` table sizes, order-major then head
        (``NgramHasher.table_sizes(layer_id)``).
    :param max_ngram_size: ``N``; also the dilation of the convolution.
    :param n_head_per_ngram: ``K``.
    :param n_embed_per_ngram: Width of one order's concatenated heads; each head's rows have
        ``n_embed_per_ngram // K`` entries.
    :param kernel_size: Convolution kernel.
    :param zero_init_conv: Start the convolution at zero (the paper).
    :param gate_norm_eps: Epsilon of the gate's key and query RMSNorms; None (the official
        demo's ``nn.RMSNorm()``): the float32 machine epsilon, ~1.19e-7 (torch's rule for
        ``eps=None``: the epsilon of the dtype it computes in, float32 for float32, bfloat16 and
        float16 inputs alike).
    :param conv_norm_eps: Epsilon of the convolution's RMSNorm (the demo's ``ShortConv``: 1e-5).
    :param table_init_std: Standard deviation of the table initialisation (the demo: 1.0). The
        key and value projections' biases start at ``nn.Linear``'s default times this value, so
        that at initialisation the keys and values, hence ``Y`` (with a zero convolution), are
        the demo's times ``table_init_std``.
    :param table_init_seed: Seed of the table initialisation.
    :param sharding: ``replicated``, ``1d`` or ``2d`` (see :class:`~.sharding.EngramTable`).
    :param shard_degree: Ranks per shard group for ``2d``.
    :param init_device: Device of the parameters (``meta`` defers allocation).

    Parameter names: ``table.weight`` (the memory; give it its own optimizer group),
    ``key_proj.*``, ``value_proj.*``, ``key_norm.weight``, ``query_norm.weight``,
    ``conv_norm.weight``, ``conv_weight``.
    """

    def __init__(
        self,
        *,
        d_model: int,
        table_sizes: Sequence[int],
        max_ngram_size: int,
        n_head_per_ngram: int,
        n_embed_per_ngram: int,
        kernel_size: int = 4,
        zero_init_conv: bool = True,
        gate_norm_eps: float | None = None,
        conv_norm_eps: float = 1e-5,
        table_init_std: float = 1.0,
        table_init_seed: int = 0,
        sharding: TableSharding | str = TableSharding.replicated,
        shard_degree: int | None = None,
        init_device: str | torch.device = "cpu",
    ):
        super().__init__()
        num_heads = (max_ngram_size - 1) * n_head_per_ngram
        if len(table_sizes) != num_heads:
            raise ValueError(
                f"got {len(table_sizes)} table sizes, need (max_ngram_size - 1) * n_head_per_ngram = {num_heads}"
            )
        if n_embed_per_ngram % n_head_per_ngram != 0:
            raise ValueError(
                f"n_embed_per_ngram={n_embed_per_ngram} must be divisible by n_head_per_ngram={n_head_per_ngram}"
            )
        if kernel_size < 1:
            raise ValueError(f"kernel_size={kernel_size} must be >= 1")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_mem = (max_ngram_size - 1) * n_embed_per_ngram
        self.kernel_size = kernel_size
        self.dilation = max_ngram_size
        self.zero_init_conv = zero_init_conv

        self.table = EngramTable(
            table_sizes=table_sizes,
            dim=n_embed_per_ngram // n_head_per_ngram,
            sharding=sharding,
            shard_degree=shard_degree,
            init_std=table_init_std,
            init_seed=table_init_seed,
            init_device=init_device,
        )
        self.key_proj = _Projection(self.d_mem, d_model, bias_scale=table_init_std, device=init_device)
        self.value_proj = _Projection(self.d_mem, d_model, bias_scale=table_init_std, device=init_device)
        self.key_norm = nn.RMSNorm(d_model, eps=gate_norm_eps, device=init_device)
        self.query_norm = nn.RMSNorm(d_model, eps=gate_norm_eps, device=init_device)
        self.conv_norm = nn.RMSNorm(d_model, eps=conv_norm_eps, device=init_device)
        # A bare parameter (not an nn.Conv1d child): OLMo-core calls reset_parameters() on
        # every module parent-first, so a child Conv1d would overwrite the zero init.
        self.conv_weight = nn.Parameter(torch.empty(d_model, 1, kernel_size, device=init_device))
        self._reset_conv()
        #: Sequence-parallel group whose ranks hold consecutive shards of each sequence (set by
        #: the block's ``apply_cp``); the convolution then reads the previous shard's halo.
        self.cp_group: Any = None

    @property
    def receptive_field(self) -> int:
        """Tokens that one output position depends on: ``(kernel - 1) * N + N``."""
        return (self.kernel_size - 1) * self.dilation + self.dilation

    def _reset_conv(self) -> None:
        if self.conv_weight.device.type == "meta":
            return
        if self.zero_init_conv:
            nn.init.zeros_(self.conv_weight)
        else:  # nn.Conv1d's default
            nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))

    def reset_parameters(self) -> None:
        """Re-initialise the convolution (children initialise themselves)."""
        self._reset_conv()

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the projections read the rows in: autocast's where it is on, else the
        projections' (bfloat16 where FSDP gathers them in bfloat16)."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.value_proj.weight.dtype

    def embed(self, hash_ids: torch.Tensor) -> torch.Tensor:
        """``e``: ``hash_ids[B, T, H] -> [B, T, d_mem]`` (heads concatenated). Sharded tables
        move the rows in :meth:`compute_dtype`."""
        wire = self.compute_dtype(hash_ids.device) if self.table.is_sharded else None
        return self.table(hash_ids, wire_dtype=wire).flatten(start_dim=-2)

    def gate(self, hidden: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """``alpha``: ``[B, T, 1]``, strictly inside (0, 1)."""
        score = (self.key_norm(self.key_proj(e)) * self.query_norm(hidden)).sum(dim=-1)
        score = score / math.sqrt(self.d_model)
        score = score.abs().clamp_min(1e-6).sqrt() * score.sign()
        return score.sigmoid().unsqueeze(-1)

    def short_conv(self, v: torch.Tensor) -> torch.Tensor:
        """``SiLU(causal depthwise dilated Conv1d(RMSNorm(v)))``, ``[B, T, d] -> [B, T, d]``."""
        y = self.conv_norm(v)
        left = (self.kernel_size - 1) * self.dilation
        if self.cp_group is not None and left > 0:  # a sequence shard: prepend the previous one's tail
            from olmx.worker.halo import previous_shard_halo

            y = torch.cat([previous_shard_halo(y, left, self.cp_group), y], dim=1)
            left = 0
        y = F.pad(y.transpose(1, 2), (left, 0))
        y = F.conv1d(y, self.conv_weight.to(y.dtype), groups=self.d_model, dilation=self.dilation)
        return F.silu(y).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, hash_ids: torch.Tensor) -> torch.Tensor:
        """``Y`` for hidden states ``[B, T, d_model]`` and hash ids ``[B, T, (N-1)*K]``."""
        e = self.embed(hash_ids).to(self.value_proj.weight.dtype)
        v = self.gate(hidden, e) * self.value_proj(e)
        return v + self.short_conv(v)

    def num_flops_per_token(self) -> int:
        """Training FLOPs per token (6 per matmul weight, like OLMo-core's feed-forward)."""
        return 6 * (2 * self.d_mem * self.d_model + self.kernel_size * self.d_model)
