"""The global gradient norm across device meshes, and clipping by it.

OLMo-core's train module clips with ``torch.nn.utils.get_total_norm``, which cannot mix
plain-tensor gradients (DDP) with DTensor gradients, nor DTensors of different meshes (experts
sharded over an expert-parallel mesh, Engram tables row-sharded over their own mesh). olmx
takes the norm itself, once per step, for every run (:class:`olmx.worker.faults.TrainingGuard`:
the same norm decides a non-finite step, scales the gradients and feeds OLMo-core's
``SkipStepAdamW``).

The global norm is ``sqrt(sum of squares)`` over every gradient, each counted once: a plain
tensor is identical on every rank after DDP's all-reduce and is summed locally; a DTensor's
local shard is summed and the sum all-reduced over every mesh dimension on which it is not
replicated (``Shard``, ``_StridedShard``, ``Partial``), never over those where it is. No
gradient is gathered: only one scalar per (mesh, placements) group crosses ranks, and the
per-tensor norms are multi-tensor (``torch._foreach_norm``) kernels, as torch's own clipping.
Under pipeline parallelism each stage holds other parameters: the sum of squares is also summed
over the pipeline group (``stages``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``sum(t.norm() ** 2)`` in float32, with one fused norm kernel per device and dtype."""
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        by_kind[(t.device, t.dtype)].append(t)
    parts = [torch.stack(torch._foreach_norm(ts)).float().pow(2).sum() for ts in by_kind.values()]
    total = parts[0]
    for part in parts[1:]:
        total = total + part.to(total.device)
    return total


@torch.no_grad()
def global_grad_norm(parameters: Iterable[torch.nn.Parameter], stages: object | None = None) -> torch.Tensor:
    """The L2 norm of all gradients of ``parameters`` (plain tensors and DTensors on any
    meshes), the same on every rank; collective over the DTensors' meshes and the pipeline
    group ``stages`` (a process group; None: no pipeline)."""
    plain: list[torch.Tensor] = []
    groups: dict[tuple[object, tuple[object, ...]], list[torch.Tensor]] = defaultdict(list)
    examples: dict[tuple[object, tuple[object, ...]], DTensor] = {}
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            key = (g.device_mesh, tuple(g.placements))
            if g.to_local().numel():
                groups[key].append(g.to_local())
            examples.setdefault(key, g)
        elif g.numel():
            plain.append(g)
    total = _sum_of_squares(plain) if plain else None
    for key, example in examples.items():
        locals_ = groups.get(key)
        sq = _sum_of_squares(locals_) if locals_ else torch.zeros((), device=example.to_local().device)
        for dim, placement in enumerate(example.placements):
            # Shard, _StridedShard (FSDP over a sharded DTensor: not a Shard subclass in torch
            # 2.13) and Partial all hold disjoint parts of the sum; only Replicate does not.
            if not placement.is_replicate():
                dist.all_reduce(sq, group=example.device_mesh.get_group(dim))
        total = sq if total is None else total + sq.to(total.device)
    total = total if total is not None else torch.zeros(())
    if stages is not None:
        dist.all_reduce(total, group=stages)
    return total.sqrt()


@torch.no_grad()
def clip_grads_with_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float, total: torch.Tensor) -> None:
    """Scale all gradients by ``min(1, max_norm / total)`` (``total``: their global norm), on
    the device, with one multi-tensor kernel per device and dtype."""
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        local = g.to_local() if isinstance(g, DTensor) else g
        by_kind[(local.device, local.dtype)].append(local)
    for (device, dtype), grads in by_kind.items():
        torch._foreach_mul_(grads, coef.to(device, dtype))


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; return the norm
    before clipping."""
    params = [p for p in parameters if p.grad is not None]
    total = global_grad_norm(params)
    clip_grads_with_norm_(params, max_norm, total)
    return total
