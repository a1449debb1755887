"""Distributed data parallel: full replicas and all-reduced gradients, or a distributed optimizer.

Without settings, OLMo-core's DDP: every rank holds the parameters, gradients and optimizer
state, and gradients are all-reduced. With ``distributed_optimizer``, gradients and optimizer
state are sharded over the data-parallel ranks (ZeRO-2).

The distributed optimizer is FSDP2 (OLMo-core's ``fsdp`` data-parallel config over all the
data-parallel ranks) with each module's ``reshard_after_forward`` turned off once the train
module has wrapped the model (torchtitan's and DeepSpeed's ZeRO-2): the parameters are gathered
once a step in the forward and kept until their backward, the gradients are reduce-scattered,
and each rank steps the optimizer on its shard only, so optimizer state and gradients take
``1 / dp`` of the replicated run's memory while the update is the replicated one. The
communication per step is DDP's (an all-gather and a reduce-scatter are one all-reduce); the
checkpoint is FSDP's (sharded tensors, resumable at another number of processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Layout, World, setting
from olmx_plugins.parallel.data_parallel import ReplicatedStrategy


@dataclass(frozen=True)
class DDPConfig:
    """Settings of ``ddp``."""

    #: Shard the gradients and the optimizer state over the data-parallel ranks (ZeRO-2): each
    #: rank holds ``1 / dp`` of them and updates its shard, the parameters are gathered once a
    #: step; the update equals the replicated one. ``false``: full replicas, all-reduce.
    distributed_optimizer: bool = setting(False)


class DistributedDataParallel(ReplicatedStrategy):
    """``ddp``: OLMo-core's DDP, or FSDP2 kept gathered through the step (ZeRO-2)."""

    def options(self, cfg: DDPConfig | None, run: Any, world: World) -> list[tuple[str, Any]]:
        """Under ``parallel=auto``: full replicas, then the distributed optimizer (the same
        communication, a fraction of the optimizer state), before any strategy that shards
        the parameters through the step."""
        if cfg is not None:
            return [("", cfg)]
        return [("", DDPConfig()), ("parallel.ddp.distributed_optimizer=true", DDPConfig(distributed_optimizer=True))]

    def layout(self, cfg: DDPConfig, dp_ranks: int, world: World) -> Layout:
        """Full replicas, or (distributed optimizer) one shard group over every data-parallel
        rank whose parameters stay gathered from the forward to the backward."""
        if cfg.distributed_optimizer:
            return Layout(replicate=1, shard=dp_ranks, shards_params=True, reshard_after_forward=False)
        return Layout(replicate=dp_ranks)

    def resolve(self, cfg: DDPConfig, ctx: Context) -> Contribution:
        """The layout in words."""
        if not cfg.distributed_optimizer:
            return super().resolve(cfg, ctx)
        dp = ctx.mesh.dp
        return Contribution(
            rows=[
                (
                    "layout",
                    f"distributed optimizer (ZeRO-2): parameters gathered once a step, gradients "
                    f"reduce-scattered, optimizer state and gradients 1/{dp} per rank",
                )
            ]
        )


DDP = DistributedDataParallel(
    name="ddp",
    config=DDPConfig,
    summary="full replicas, gradients all-reduced",
)
