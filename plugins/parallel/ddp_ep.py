"""DDP + expert parallel: dense parameters replicated, experts sharded and kept in place.

Tokens travel to their experts' ranks with all-to-all and back (OLMo-core 3's design for MoE
training without FSDP). Experts are never gathered; each rank of an expert group holds
``num_experts / degree`` of them, replicated across ``world / degree`` groups. This strategy
only claims the expert-parallel degree (``mesh.ep``); the layer with experts places them.

With ``distributed_optimizer`` the dense parameters' gradients and optimizer state are sharded
over the data-parallel ranks too (ZeRO-2, as ``parallel.ddp.distributed_optimizer``): OLMo-core's
FSDP2 over every data-parallel rank, kept gathered from the forward to the backward; the experts
stay where the layer placed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Layout, World, setting
from olmx_plugins.parallel.data_parallel import ReplicatedStrategy


@dataclass(frozen=True)
class DDPEPConfig:
    """Settings of ``ddp_ep``."""

    #: Expert-parallel group size: must divide the number of experts and the world size.
    degree: int = setting(2, ge=1)
    #: Shard the dense parameters' gradients and optimizer state over the data-parallel ranks
    #: (ZeRO-2): each rank holds ``1 / dp`` of them and updates its shard, the parameters are
    #: gathered once a step; the update equals the replicated one. ``false``: DDP's replicas.
    distributed_optimizer: bool = setting(False)


class DDPExpertParallel(ReplicatedStrategy):
    """OLMo-core DDP for dense parameters; experts sharded over ``degree`` ranks."""

    provides = ("experts",)

    def options(self, cfg: DDPEPConfig | None, run: Any, world: World) -> list[tuple[str, Any]]:
        """Under ``parallel=auto``: every degree from 2 up that divides the world size, smallest
        first (the layer with experts checks that it divides its experts)."""
        if cfg is not None:
            return [("", cfg)]
        degrees = [d for d in range(2, world.size + 1) if not world.size % d]
        return [(f"parallel.ddp_ep.degree={d}", DDPEPConfig(degree=d)) for d in degrees]

    def layout(self, cfg: DDPEPConfig, dp_ranks: int, world: World) -> Layout:
        """Replicas of the dense parameters, or (distributed optimizer) one shard group over every
        data-parallel rank kept gathered through the step; ``ep = degree``."""
        field = "parallel.ddp_ep.degree"
        if cfg.distributed_optimizer:
            return Layout(
                replicate=1,
                shard=dp_ranks,
                shards_params=True,
                reshard_after_forward=False,
                ep=cfg.degree,
                ep_field=field,
            )
        return Layout(replicate=dp_ranks, ep=cfg.degree, ep_field=field)

    def resolve(self, cfg: DDPEPConfig, ctx: Context) -> Contribution:
        """The layout in words."""
        groups = ctx.mesh.dp // ctx.mesh.ep
        layout = self._summary
        if cfg.distributed_optimizer:
            layout = (
                f"distributed optimizer (ZeRO-2) for the dense parameters: gathered once a step, gradients "
                f"reduce-scattered, optimizer state and gradients 1/{ctx.mesh.dp} per rank; experts sharded"
            )
        return Contribution(
            rows=[("layout", layout), ("expert parallel", f"degree {ctx.mesh.ep}, {groups} replica group(s)")]
        )


DDP_EP = DDPExpertParallel(
    name="ddp_ep",
    config=DDPEPConfig,
    summary="dense parameters replicated (DDP), experts sharded",
    dp_type="ddp",
)
