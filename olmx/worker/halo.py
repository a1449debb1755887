"""Halo exchange for token-local layers under sequence parallelism.

A causal layer whose output at position t reads positions ``t - h .. t`` (a causal
convolution, Engram's dilated short convolution with ``h = (kernel - 1) * dilation``) needs,
on the rank holding shard r of a sequence (contiguous Ulysses sharding), the last h positions
of shard r - 1. :func:`previous_shard_halo` returns them (zeros on the group's first rank,
which is exactly the causal zero padding of the unsharded layer), so that

    y_r = conv(cat([previous_shard_halo(x_r, h, group), x_r]))   # no left padding

equals the unsharded ``conv(pad(x, h))`` restricted to shard r. The backward pass sends the
halo's gradient back to the rank it came from and adds it to that rank's last h positions.

Communication is an all-gather of every rank's last h positions (h is a handful of tokens, so
its size is negligible next to attention's all-to-all); it works on gloo and NCCL alike.
Requires ``h <= seq_len / degree`` (the plan checks it for the layers that use it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["previous_shard_halo"]


class _PreviousShardHalo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, size: int, group: dist.ProcessGroup) -> torch.Tensor:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        tail = x[:, x.shape[1] - size :].contiguous()
        tails = [torch.empty_like(tail) for _ in range(world)]
        dist.all_gather(tails, tail, group=group)
        ctx.size, ctx.group, ctx.shape = size, group, x.shape
        return tails[rank - 1] if rank > 0 else torch.zeros_like(tail)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(grads, grad.contiguous(), group=ctx.group)
        grad_x = grad.new_zeros(ctx.shape)
        if rank < world - 1:  # the next rank read my tail
            grad_x[:, ctx.shape[1] - ctx.size :] = grads[rank + 1]
        return grad_x, None, None


def previous_shard_halo(x: torch.Tensor, size: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The last ``size`` positions (dim 1) of the previous rank's shard of ``x [B, T/P, ...]``
    in ``group``; zeros on the group's first rank. Differentiable."""
    if not 0 < size <= x.shape[1]:
        raise ValueError(f"halo of {size} positions needs 0 < size <= the local shard length {x.shape[1]}")
    return _PreviousShardHalo.apply(x, size, group)
