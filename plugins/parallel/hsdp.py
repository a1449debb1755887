"""Hybrid sharded data parallel: parameters sharded within a group, replicated across groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from olmx.errors import ConfigError
from olmx.api import Contribution, World
from olmx_plugins.parallel.fsdp import FSDPConfig, FullyShardedStrategy


@dataclass
class HSDPConfig(FSDPConfig):
    """Settings of ``hsdp`` (plus FSDP's wrapping settings)."""

    #: Ranks a parameter is sharded over; null means the processes of one node, so that
    #: all-gathers stay inside a node and only gradients cross nodes.
    shard_degree: Optional[int] = None
    #: Replica groups; null means data-parallel ranks / shard_degree.
    num_replicas: Optional[int] = None
    #: Shard the experts of a MoE model over each dp_shard group (expert-parallel degree =
    #: shard_degree, OLMo-core v1's layout) instead of FSDP-sharding them.
    expert_parallel: bool = False


class HybridShardedStrategy(FullyShardedStrategy):
    """HSDP through OLMo-core (FSDP2 on a 2-D ``dp_replicate x dp_shard`` mesh)."""

    def resolve(self, cfg: HSDPConfig, run: Any, world: World) -> Contribution:
        """FSDP's checks, plus the expert-parallel ones when enabled."""
        c = super().resolve(cfg, run, world)
        if cfg.expert_parallel:
            from olmx_plugins.parallel.ddp_ep import check_expert_parallel

            shard = cfg.shard_degree or (world.size // cfg.num_replicas if cfg.num_replicas
                                         else min(world.nproc_per_node, world.size))
            c.rows += check_expert_parallel("parallel.hsdp.expert_parallel", shard, run, world.size).rows
        return c

    def apply_model(self, cfg: HSDPConfig, model: Any, plan: Any) -> None:
        """With ``expert_parallel``: shard the portable experts over each dp_shard group (a model
        on the olmo_core MoE backend has none; the moe plugin gives it OLMo-core's own EP)."""
        if not cfg.expert_parallel:
            return
        from torch.distributed.device_mesh import init_device_mesh

        from olmx_plugins.layers.moe.expert_parallel import apply_expert_parallel

        device = "cuda" if plan.world.device == "cuda" else "cpu"
        # Experts get their own FSDP over the replica groups (the outer HSDP then skips them):
        # sharded over dp_shard as experts, averaged over dp_replicate.
        mesh = init_device_mesh(device, (plan.mesh["dp_replicate"], plan.mesh["dp_shard"]),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
        apply_expert_parallel(model, ep_mesh=mesh["dp_shard"], replicate_mesh=mesh["dp_replicate"])

    def dp_mesh(self, cfg: HSDPConfig, dp_ranks: int, world: World) -> dict[str, int]:
        """``dp_replicate x dp_shard`` covering the data-parallel ranks."""
        shard = cfg.shard_degree
        if shard is None:
            shard = dp_ranks // cfg.num_replicas if cfg.num_replicas else min(world.nproc_per_node, dp_ranks)
        if shard < 1 or dp_ranks % shard:
            raise ConfigError("parallel.hsdp.shard_degree",
                              f"{shard} must divide the {dp_ranks} data-parallel ranks")
        replicas = cfg.num_replicas if cfg.num_replicas is not None else dp_ranks // shard
        if replicas * shard != dp_ranks:
            raise ConfigError("parallel.hsdp.num_replicas",
                              f"{replicas} replicas x shard_degree {shard} = {replicas * shard}, "
                              f"but there are {dp_ranks} data-parallel ranks")
        return {"dp_replicate": replicas, "dp_shard": shard}

    def dp_config_kwargs(self, cfg: Any) -> dict[str, Any]:
        """FSDP's settings plus the replica / shard split (OLMo-core derives the other)."""
        kwargs = super().dp_config_kwargs(cfg)
        kwargs["shard_degree"] = cfg.shard_degree
        kwargs["num_replicas"] = cfg.num_replicas
        return kwargs

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Any) -> None:
        """Pin both degrees to the plan's mesh so OLMo-core builds exactly that layout."""
        from dataclasses import replace

        pinned = replace(cfg, shard_degree=plan.mesh["dp_shard"], num_replicas=plan.mesh["dp_replicate"])
        super().apply_train_module(pinned, train_module, plan)


HSDP = HybridShardedStrategy(
    name="hsdp", description=__doc__.splitlines()[0], config=HSDPConfig,
    summary="parameters sharded within dp_shard groups, replicated across dp_replicate",
)
