"""Ulysses sequence parallelism around any single-device OLMo-core attention backend.

Method (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509; DeepSpeed's
``deepspeed/sequence/layer.py::DistributedAttention`` wraps a local attention the same way).
With P ranks in a sequence-parallel group, every rank holds a contiguous N/P-token shard of
each sequence with all H heads. Around attention:

1. seq -> head: one all-to-all per tensor turns ``q [B, N/P, H, d]`` into ``[B, N, H/P, d]``
   (rank r receives heads ``r*H/P .. (r+1)*H/P - 1`` of the whole sequence); k and v the same,
   in one all-to-all.
2. The wrapped backend runs ordinary causal attention over the full sequence for its heads,
   so sliding windows, document masks and sinks see global positions.
3. head -> seq: one all-to-all turns the output ``[B, N, H/P, d]`` back into ``[B, N/P, H, d]``.

The all-to-alls (:func:`seq_to_heads`, :func:`heads_to_seq`) lay tensors out as OLMo-core's
``all_to_all_single_cp2hp`` / ``_hp2cp`` do (``olmo_core.distributed.parallel.context_parallel``),
on torch's functional collective ``all_to_all_single_autograd``
(``torch.distributed._functional_collectives``), which ``torch.compile`` traces: OLMo-core's go
through ``torch.distributed.nn.functional.all_to_all_single``, which torch 2.13 cannot trace
(frames fall back to eager; ``fullgraph=True`` raises). Inputs are made contiguous first (gloo
fills a non-contiguous buffer as if it were contiguous); k and v travel together,
concatenated along their last (head_dim) axis. Not the list version ``all_to_all_cp2hp``: on
gloo, torch 2.13's autograd ``all_to_all`` emulates
the exchange with ``scatter(src=i)`` and reads ``i`` as a global rank, so every Ulysses group
that does not contain global rank 0 fails ("Global rank 0 is not part of group"), e.g. with
2 data x 2 sequence ranks. OLMo-core's own Ulysses code inside its
attention backends is not used: in OLMo-core 3.0.0 it (a) fails with a shape error when there
are fewer kv heads than ranks (``all_to_all_cp2hp`` views ``[B, N/P, P, H_kv/P, d]`` with
``H_kv/P = 0``: "shape '[2, 16, 2, 0, 16]' is invalid"), (b) builds the torch backend's
sliding-window mask from the local shard length before the all-to-all, so SDPA gets an
``N/P x N/P`` mask for ``N x N`` scores, and (c) passes all H sink logits to H/P heads.

KV-head replication (GQA/MQA with ``H_kv % P != 0``), as DeepSpeed's Ulysses does for
``H_kv < P``: repeat every kv head ``f`` times (``repeat_interleave``) so that there are
``m = lcm(H_kv, P)`` kv heads. Query head i uses kv head ``i // (H/H_kv)``; after replication
it uses replicated head ``i // (H/m)``, which is a copy of the same original head, and the
H/P query heads a rank receives need exactly the m/P replicated kv heads it receives (m
divides H because H_kv and P both do). The backward of ``repeat_interleave`` sums the copies'
gradients, so gradients are exact. Cost: k/v all-to-all volume grows by ``m / H_kv``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["UlyssesAttention", "apply_ulysses_attention"]


class UlyssesAttention(nn.Module):
    """Wraps an OLMo-core ``AttentionBackend``: all-to-all in, the backend on the full
    sequence with H/P heads, all-to-all out. Without an applied Ulysses group it is the
    backend unchanged.

    Stands in for the backend at ``Attention.backend``; OLMo-core's ``Attention.apply_cp``
    calls :meth:`apply_cp` here instead of on the backend, which therefore stays a
    single-device backend. Attributes it does not have (``window_size``, ``scale``, ...) are
    read from the wrapped backend.

    :param inner: The backend to wrap (``torch``, ``flash_2``, ``flash_3``, ``flash_4``).
    :param n_heads: Query heads of the attention module.
    :param n_kv_heads: Key/value heads of the attention module.
    """

    def __init__(self, inner: nn.Module, *, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.inner = inner
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.cp_pg: dist.ProcessGroup | None = None
        self.cp_degree, self.cp_rank = 1, 0
        self.cp_enabled = False
        self.kv_repeat = 1

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None:
                raise
            return getattr(inner, name)

    def apply_cp(self, cp_mesh: Any, ring: Any = None, uly: Any = None) -> None:
        """Join the Ulysses group of ``cp_mesh`` (OLMo-core calls this from ``Attention.apply_cp``).

        Ring attention is not this wrapper's business and is refused.
        """
        if ring is not None or uly is None:
            raise ValueError("UlyssesAttention only implements Ulysses context parallelism (uly=...)")
        group = cp_mesh.get_group()
        degree = dist.get_world_size(group)
        if self.n_heads % degree:
            raise ValueError(f"Ulysses degree {degree} must divide the {self.n_heads} query heads")
        kv = math.lcm(self.n_kv_heads, degree)  # DeepSpeed-style replication, as the plan says
        self.kv_repeat = kv // self.n_kv_heads
        # The torch backend repeats kv heads by n_heads // n_kv_heads for SDPA; after the
        # replication above that ratio is H / m (the same on every rank's H/P, m/P heads).
        self.inner.n_kv_heads = kv
        self.cp_pg = group
        self.cp_degree, self.cp_rank = degree, dist.get_rank(group)
        self.cp_enabled = True

    def forward(
        self,
        qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | torch.Tensor,
        *,
        sinks: torch.Tensor | None = None,
        kv_cache_manager: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``q [B, N/P, H, d], k, v [B, N/P, H_kv, d] -> [B, N/P, H, d]``; other keyword
        arguments (document lengths, ...) describe the full sequence and go to the backend."""
        if not self.cp_enabled:
            return self.inner(qkv, sinks=sinks, kv_cache_manager=kv_cache_manager, **kwargs)
        if isinstance(qkv, torch.Tensor):
            raise RuntimeError("Ulysses attention takes separate q, k, v (not a packed QKV tensor)")
        if kv_cache_manager is not None:
            raise RuntimeError("Ulysses attention does not support KV caching")
        assert self.cp_pg is not None
        q, k, v = qkv
        if self.kv_repeat > 1:
            k = k.repeat_interleave(self.kv_repeat, dim=2)
            v = v.repeat_interleave(self.kv_repeat, dim=2)
        degree = self.cp_degree
        q = seq_to_heads(q, self.cp_pg, degree)
        # k and v side by side in the last dim: one all-to-all, split after
        k, v = seq_to_heads(torch.cat([k, v], dim=-1), self.cp_pg, degree).chunk(2, dim=-1)
        if sinks is not None:  # one logit per head: keep this rank's heads
            sinks = sinks.chunk(degree)[self.cp_rank]
        out = self.inner((q, k, v), sinks=sinks, **kwargs)
        return heads_to_seq(out, self.cp_pg, degree)


def _exchange(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Equal-split all-to-all along dim 0, differentiable and traceable by ``torch.compile``."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    out = all_to_all_single_autograd(x.contiguous(), None, None, group)
    # A functional collective returns an async tensor; wait_tensor makes it an ordinary one.
    return torch.ops._c10d_functional.wait_tensor(out)


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup, degree: int) -> torch.Tensor:
    """``[B, N/P, H, d]`` (this rank's sequence shard, all heads) -> ``[B, N, H/P, d]`` (the
    whole sequence, this rank's heads)."""
    b, t, h, d = x.shape
    parts = x.view(b, t, degree, h // degree, d).permute(2, 0, 1, 3, 4).flatten(0, 3)
    out = _exchange(parts, group).view(degree, b, t, h // degree, d).permute(1, 0, 2, 3, 4)
    return out.reshape(b, t * degree, h // degree, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup, degree: int) -> torch.Tensor:
    """``[B, N, H/P, d]`` -> ``[B, N/P, H, d]``: the inverse of :func:`seq_to_heads`."""
    b, t, h, d = x.shape
    parts = x.view(b, degree, t // degree, h, d).permute(1, 0, 2, 3, 4).flatten(0, 3)
    out = _exchange(parts, group).view(degree, b, t // degree, h, d).permute(1, 2, 0, 3, 4)
    return out.reshape(b, t // degree, h * degree, d).contiguous()


def apply_ulysses_attention(model: nn.Module) -> int:
    """Wrap every attention backend of ``model`` in :class:`UlyssesAttention`; returns how
    many were wrapped.

    Call on the built model before OLMo-core's ``parallelize_model`` (context parallelism,
    activation checkpointing, compile, FSDP/DDP), like a layer plugin's ``apply_model``.
    TransformerEngine backends are left alone: they do their own Ulysses all-to-all
    (``cp_comm_type="a2a"``) and need ``H_kv`` divisible by the degree (the plan checks it).
    """
    from olmo_core.nn.attention.backend import AttentionBackend, TEAttentionBackend

    wrapped = 0
    for module in list(model.modules()):
        backend = getattr(module, "backend", None)
        if not isinstance(backend, AttentionBackend) or isinstance(backend, TEAttentionBackend):
            continue
        module.backend = UlyssesAttention(backend, n_heads=module.n_heads, n_kv_heads=module.n_kv_heads)
        wrapped += 1
    return wrapped
