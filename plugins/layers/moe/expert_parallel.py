"""Expert parallelism for the portable MoE: experts sharded over a process group, tokens moved
with ``all_to_all_single``.

Layout
------
With ``P`` ranks in the expert-parallel (EP) group and ``E`` experts, rank ``r`` holds experts
``[r*E/P, (r+1)*E/P)``: ``w1/w2/w3`` become DTensors ``Shard(0)`` over the EP mesh (global shape
and names unchanged, so checkpoints reshard between EP degrees; locally ``[E/P, ...]``; nothing
is ever gathered).

Forward of one layer (each rank routes its own tokens, ``MoEFeedForward.forward``):

1. rows sorted by global expert id, ``c[e]`` rows for expert ``e``;
2. ``all_to_all_single`` of the counts (``E/P`` per peer): ``recv[s, j]`` = rows rank ``s``
   sends for my local expert ``j``;
3. ``all_to_all_single`` of the rows with input splits ``c.view(P, E/P).sum(1)`` and output
   splits ``recv.sum(1)``; received rows are ordered (source, local expert) and are regrouped
   by local expert with a stable permutation;
4. local experts (grouped matmul), inverse permutation, the reverse ``all_to_all_single``.

One host sync per layer and micro-batch: the split sizes of steps 2-3, both directions in one
``tolist``. Rows travel in the dtype the experts compute in (under ``torch.autocast``: its
dtype, e.g. bfloat16, half the bytes of the float32 residual stream), the outputs come back in
it.

The row exchange is the functional collective ``all_to_all_single_autograd``
(``torch.distributed._functional_collectives``; ``torch.distributed.nn.functional`` is
deprecated in torch 2.13), whose backward is the same collective with the splits swapped; it
works on gloo with uneven splits. Inputs are made contiguous and the collective allocates its
own contiguous output: gloo fills a non-contiguous output buffer as if it were contiguous,
silently permuting values.

Gradients and data parallelism
------------------------------
The world is ``R x P``: ``R`` replicas of each EP group (``replicate_mesh``, size ``R``), the EP
group (``ep_mesh``, size ``P``), both sub-meshes of one 2-D ``DeviceMesh``. Training minimises
the mean of the ``W = R*P`` per-rank losses; dense parameters get it from DDP/FSDP (average
over all ``W`` ranks). Expert ``e`` is held by one rank per EP group; the all-to-all backward
already sums the contributions of the ``P`` ranks of its EP group into that rank's gradient,
so the expert gradient needs ``sum over the R replicas / W``:

* the experts multiply their weight gradients by ``1/P`` inside the graph (``grad_scale``), so
  it holds however the parameters are wrapped, with gradient accumulation and recomputation;
* the experts module is wrapped with FSDP2 ``fully_shard`` over ``replicate_mesh`` (as OLMo-core
  does for EP + HSDP, ``MoEMLPBase.prepare_experts_for_fsdp``). FSDP averages their gradients
  over the ``R`` replicas, and both OLMo-core wrappers then leave them alone: ``replicate``
  (OLMo-core DDP) skips parameters of modules already managed by ``fully_shard``, and an outer
  ``fully_shard`` (FSDP/HSDP) skips parameters owned by a nested FSDP module. ``R = 1`` is a
  size-1 mesh (no communication). Wrap before the model's DDP/FSDP is applied. Side effect for
  ``R > 1``: at rest each rank stores ``1/R`` of its ``E/P`` experts (ZeRO-3 over the replicas);
  they are all-gathered over the replica group, never over the EP group, for compute.

So the expert gradients are excluded from the data-parallel reduction over the whole world and
reduced over the replica group only; the tests check them against a single-process model.

Wiring (tested with OLMo-core's own wrappers, 2 and 4 gloo processes):

* DDP + EP: ``mesh = init_device_mesh(dev, (W // P, P), mesh_dim_names=("ep_replicate",
  "ep_shard"))``; ``apply_expert_parallel(model, ep_mesh=mesh["ep_shard"],
  replicate_mesh=mesh["ep_replicate"])``; then ``model.apply_ddp(dp_mesh=get_dp_model_mesh(mesh))``
  (OLMo-core flattens the two dims into ``dp``). Dense gradients are then plain tensors and
  expert gradients DTensors, which OLMo-core's gradient clipping
  (``torch.nn.utils.get_total_norm``) rejects; the core clips across meshes
  (:mod:`olmx.worker.clip`).
* HSDP + EP (OLMo-core's layout): ``mesh`` with dims ``("dp_replicate", "dp_shard")``, EP over
  ``"dp_shard"``, replicas over ``"dp_replicate"``, then ``model.apply_fsdp(dp_mesh=mesh)``. All
  gradients are DTensors on one mesh and OLMo-core's clipping works as is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

from .modules import MoEExperts, MoEFeedForward, autocast_dtype, moe_layers

__all__ = ["all_to_all", "ExpertParallelDispatch", "apply_expert_parallel"]


def all_to_all(
    x: torch.Tensor,
    *,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` along dim 0 with uneven splits (gloo-safe)."""
    return all_to_all_single_autograd(x.contiguous(), output_split_sizes, input_split_sizes, group)


class ExpertParallelDispatch:
    """Sends expert rows to the ranks that hold their experts and brings the outputs back."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.world_size = dist.get_world_size(group)

    def __call__(self, rows: torch.Tensor, tokens_per_expert: torch.Tensor, experts: MoEExperts) -> torch.Tensor:
        """Expert outputs for ``rows`` sorted by global expert (``tokens_per_expert``: ``[E]``).

        One host sync: the split sizes of both directions come back in one copy. Rows travel
        in the dtype the experts compute in (autocast's, e.g. bfloat16, where it is on: the
        experts would cast them on arrival anyway), so the result is the single-process one."""
        P = self.world_size
        num_local = tokens_per_expert.numel() // P
        with torch.no_grad():
            send_counts = tokens_per_expert.contiguous()
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts, group=self.group)
            sent, received_counts = torch.stack([send_counts, recv_counts]).view(2, P, num_local).sum(2).tolist()
            recv_counts = recv_counts.view(P, num_local)  # [source rank, local expert]
            local_expert_of_row = torch.repeat_interleave(
                torch.arange(num_local, device=rows.device).repeat(P),
                recv_counts.reshape(-1),
                output_size=sum(received_counts),  # known: no second sync
            )
            perm = torch.argsort(local_expert_of_row, stable=True)
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(perm.numel(), device=perm.device)

        rows = rows.to(autocast_dtype(rows.device.type) or rows.dtype)
        received = all_to_all(rows, output_split_sizes=received_counts, input_split_sizes=sent, group=self.group)
        out = experts(received[perm], recv_counts.sum(0))
        return all_to_all(out[inverse], output_split_sizes=sent, input_split_sizes=received_counts, group=self.group)


def _shard_experts(moe: MoEFeedForward, ep_mesh: DeviceMesh) -> None:
    P = ep_mesh.size()
    if moe.num_experts % P != 0:
        raise ValueError(f"num_experts={moe.num_experts} must be divisible by the expert-parallel degree {P}")
    experts = moe.experts
    for name in ("w1", "w2", "w3"):
        # src_data_rank=None: each rank keeps its own slice, no communication (the seeded init
        # makes every rank's copy identical; on 'meta' nothing is allocated).
        sharded = distribute_tensor(getattr(experts, name).detach(), ep_mesh, [Shard(0)], src_data_rank=None)
        experts.register_parameter(name, nn.Parameter(sharded))
    experts.grad_scale = 1.0 / P
    moe.dispatch = ExpertParallelDispatch(ep_mesh.get_group())


def apply_expert_parallel(
    model: nn.Module,
    *,
    ep_mesh: DeviceMesh,
    replicate_mesh: DeviceMesh | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> int:
    """Shard the routed experts of every :class:`MoEFeedForward` in ``model`` over ``ep_mesh``.

    Call on the built model before OLMo-core's DDP/FSDP/HSDP is applied and before
    ``init_weights`` (a model built on ``meta`` is fine).

    :param ep_mesh: 1-D mesh of the expert-parallel group (size ``P`` must divide ``num_experts``).
    :param replicate_mesh: 1-D mesh of the replica group (size ``W / P``; may be 1), a sibling
        dimension of ``ep_mesh`` in the same 2-D mesh, e.g. ``init_device_mesh(dev, (W // P, P),
        mesh_dim_names=("ep_replicate", "ep_shard"))``. Required whenever the model is wrapped by
        DDP/FSDP afterwards: the experts are then wrapped with ``fully_shard`` over it, which
        reduces their gradients over the replicas and hides them from the outer wrapper. ``None``
        leaves gradient reduction to the caller (tests, custom loops).
    :param mp_policy: FSDP mixed-precision policy for the experts (match the model's
        ``param_dtype``/``reduce_dtype``); FSDP's default when ``None``.
    :returns: The number of MoE layers sharded.
    """
    if ep_mesh.ndim != 1:
        raise ValueError("ep_mesh must be 1-dimensional")
    layers = moe_layers(model)
    for moe in layers:
        _shard_experts(moe, ep_mesh)
        if replicate_mesh is not None:
            fully_shard(moe.experts, mesh=replicate_mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    return len(layers)
