"""The core's gradient clipping across device meshes (``plan.clip == "olmx"``).

OLMo-core's train module clips with ``torch.nn.utils.get_total_norm``, which cannot mix
plain-tensor gradients (DDP) with DTensor gradients, nor DTensors of different meshes (experts
sharded over an expert-parallel mesh, Engram tables row-sharded over their own mesh). Plugins
that put parameters on a mesh of their own say so (``Contribution.own_mesh_params``); the plan
then disables OLMo-core's clipping and this callback clips instead, once, for all of them.

The global norm is ``sqrt(sum of squares)`` over every gradient, each counted once: a plain
tensor is identical on every rank after DDP's all-reduce and is summed locally; a DTensor's
local shard is summed and the sum all-reduced over every mesh dimension on which it is not
replicated (``Shard``, ``_StridedShard``, ``Partial``), never over those where it is. No
gradient is gathered: only one scalar per (mesh, placements) group crosses ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from olmo_core.train.callbacks import Callback
from torch.distributed.tensor import DTensor


@torch.no_grad()
def global_grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all gradients of ``parameters`` (plain tensors and DTensors on any
    meshes), the same on every rank; collective over the DTensors' meshes."""
    plain: torch.Tensor | None = None
    groups: dict[tuple[object, tuple[object, ...]], torch.Tensor] = {}
    meshes: dict[tuple[object, tuple[object, ...]], DTensor] = {}
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            key = (g.device_mesh, tuple(g.placements))
            sq = g.to_local().float().pow(2).sum()
            groups[key] = groups[key] + sq if key in groups else sq
            meshes.setdefault(key, g)
        else:
            sq = g.float().pow(2).sum()
            plain = sq if plain is None else plain + sq
    total = plain
    for key, sq in groups.items():
        example = meshes[key]
        for dim, placement in enumerate(example.placements):
            # Shard, _StridedShard (FSDP over a sharded DTensor: not a Shard subclass in torch
            # 2.13) and Partial all hold disjoint parts of the sum; only Replicate does not.
            if not placement.is_replicate():
                dist.all_reduce(sq, group=example.device_mesh.get_group(dim))
        total = sq if total is None else total + sq.to(total.device)
    return (total if total is not None else torch.zeros(())).sqrt()


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; return the norm
    before clipping."""
    params = [p for p in parameters if p.grad is not None]
    total = global_grad_norm(params)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in params:
        g = p.grad
        local = g.to_local() if isinstance(g, DTensor) else g
        local.mul_(coef.to(local.device, local.dtype))
    return total


@dataclass
class GradClipCallback(Callback):
    """Global-norm gradient clipping before every optimizer step, across device meshes;
    records the norm as OLMo-core's own clipping does (``optim/total grad norm``)."""

    max_norm: float = 1.0

    def pre_optim_step(self) -> None:
        """After the last micro-batch's backward, before the step."""
        norm = clip_grad_norm_(self.trainer.train_module.model.parameters(), self.max_norm)
        self.trainer.record_metric("total grad norm", norm, reduce_type=None, namespace="optim")
