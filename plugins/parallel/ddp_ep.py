"""DDP + expert parallel: dense parameters replicated, experts sharded and kept in place.

Tokens travel to their experts' ranks with all-to-all and back (OLMo-core 3's design for MoE
training without FSDP). Experts are never gathered; each rank of an expert group holds
``num_experts / degree`` of them, replicated across ``world / degree`` groups. This strategy
only claims the expert-parallel degree (``mesh.ep``); the layer with experts places them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Layout, World, setting
from olmx_plugins.parallel.data_parallel import DataParallelStrategy


@dataclass
class DDPEPConfig:
    """Settings of ``ddp_ep``."""

    #: Expert-parallel group size: must divide the number of experts and the world size.
    degree: int = setting(2, ge=1)


class DDPExpertParallel(DataParallelStrategy):
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
        """Replicas of the dense parameters; ``ep = degree``."""
        return Layout(replicate=dp_ranks, ep=cfg.degree, ep_field="parallel.ddp_ep.degree")

    def resolve(self, cfg: DDPEPConfig, ctx: Context) -> Contribution:
        """The layout in words."""
        groups = ctx.mesh.dp // ctx.mesh.ep
        return Contribution(
            rows=[("layout", self._summary), ("expert parallel", f"degree {ctx.mesh.ep}, {groups} replica group(s)")]
        )


DDP_EP = DDPExpertParallel(
    name="ddp_ep",
    description=__doc__.splitlines()[0],
    config=DDPEPConfig,
    summary="dense parameters replicated (DDP), experts sharded",
    dp_type="ddp",
)
