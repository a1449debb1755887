"""Hybrid sharded data parallel: parameters sharded within a group, replicated across groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from olmx.api import Context, Contribution, Layout, World, setting
from olmx.errors import ConfigError
from olmx_plugins.parallel.data_parallel import FSDPConfig, FullyShardedStrategy


@dataclass(frozen=True)
class HSDPConfig(FSDPConfig):
    """Settings of ``hsdp`` (plus FSDP's wrapping settings)."""

    #: Ranks a parameter is sharded over; null means the processes of one node, so that
    #: all-gathers stay inside a node and only gradients cross nodes.
    shard_degree: Optional[int] = setting(None, ge=1, integer=True)
    #: Replica groups; null means data-parallel ranks / shard_degree.
    num_replicas: Optional[int] = setting(None, ge=1, integer=True)
    #: Shard the experts of a MoE model over each dp_shard group (expert-parallel degree =
    #: shard_degree, OLMo-core v1's layout) instead of FSDP-sharding them.
    expert_parallel: bool = False


class HybridShardedStrategy(FullyShardedStrategy):
    """HSDP through OLMo-core (FSDP2 on a 2-D ``dp_replicate x dp_shard`` mesh)."""

    provides = ("hybrid",)

    def layout(self, cfg: HSDPConfig, dp_ranks: int, world: World) -> Layout:
        """``dp_replicate x dp_shard`` covering the data-parallel ranks; with
        ``expert_parallel`` the experts are split over each shard group (``ep = dp_shard``)."""
        shard = cfg.shard_degree
        if shard is None:
            shard = dp_ranks // cfg.num_replicas if cfg.num_replicas else min(world.nproc_per_node, dp_ranks)
        if shard < 1 or dp_ranks % shard:  # (a default shard is 0 where num_replicas > ranks)
            raise ConfigError("parallel.hsdp.shard_degree", f"{shard} must divide the {dp_ranks} data-parallel ranks")
        replicas = cfg.num_replicas if cfg.num_replicas is not None else dp_ranks // shard
        if replicas * shard != dp_ranks:
            raise ConfigError(
                "parallel.hsdp.num_replicas",
                f"{replicas} replicas x shard_degree {shard} = {replicas * shard}, "
                f"but there are {dp_ranks} data-parallel ranks",
            )
        return Layout(
            replicate=replicas,
            shard=shard,
            shards_params=True,
            hybrid=True,
            ep=shard if cfg.expert_parallel else 1,
            ep_field="parallel.hsdp.expert_parallel",
        )

    def resolve(self, cfg: HSDPConfig, ctx: Context) -> Contribution:
        """The layout in words."""
        c = super().resolve(cfg, ctx)
        if ctx.mesh.ep > 1:
            c.rows.append(
                (
                    "expert parallel",
                    f"degree {ctx.mesh.ep} (each dp_shard group), {ctx.mesh.dp_replicate} replica group(s)",
                )
            )
        return c

    def dp_config_kwargs(self, cfg: Any, plan: Any) -> dict[str, Any]:
        """FSDP's settings plus both degrees pinned to the plan's mesh, so OLMo-core builds
        exactly that layout."""
        kwargs = super().dp_config_kwargs(cfg, plan)
        kwargs["shard_degree"] = plan.mesh.dp_shard
        kwargs["num_replicas"] = plan.mesh.dp_replicate
        return kwargs


HSDP = HybridShardedStrategy(
    name="hsdp",
    config=HSDPConfig,
    summary="parameters sharded within dp_shard groups, replicated across dp_replicate",
)
