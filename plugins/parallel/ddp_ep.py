"""DDP + expert parallel: dense parameters replicated, experts sharded and kept in place.

Tokens travel to their experts' ranks with ``all_to_all_single`` and back (OLMo-core 3's
design for MoE training without FSDP). Experts are never gathered; each rank of an expert
group holds ``num_experts / degree`` of them, replicated across ``world / degree`` groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.errors import ConfigError
from olmx.api import Contribution, World
from olmx_plugins.parallel.data_parallel import DataParallelStrategy


@dataclass
class DDPEPConfig:
    """Settings of ``ddp_ep``."""

    #: Expert-parallel group size: must divide the number of experts and the world size.
    degree: int = 2


def check_expert_parallel(field: str, degree: int, run: Any, ranks: int) -> Contribution:
    """Shared EP checks: a MoE model, and a degree dividing experts and ranks."""
    if "moe" not in run.layers:
        raise ConfigError(field, "expert parallelism needs a mixture-of-experts model: add layers=[moe]")
    experts = run.layers["moe"].num_experts
    if degree < 1 or experts % degree:
        raise ConfigError(field, f"{degree} must divide layers.moe.num_experts={experts}")
    if ranks % degree:
        raise ConfigError(field, f"{degree} must divide the {ranks} data-parallel ranks")
    return Contribution(rows=[("expert parallel", f"degree {degree}: {experts // degree} experts per rank, "
                                                  f"{ranks // degree} replica group(s)")])


class DDPExpertParallel(DataParallelStrategy):
    """OLMo-core DDP for dense parameters plus olmx's portable expert parallelism."""

    def resolve(self, cfg: DDPEPConfig, run: Any, world: World) -> Contribution:
        """EP checks against the model and the world."""
        c = check_expert_parallel("parallel.ddp_ep.degree", cfg.degree, run, world.size)
        c.rows.insert(0, ("layout", self._summary))
        c.data_parallel = True
        return c

    def apply_model(self, cfg: DDPEPConfig, model: Any, plan: Any) -> None:
        """Shard the experts over ``degree`` ranks; FSDP over the replica groups keeps them
        out of DDP and averages their gradients across replicas."""
        from torch.distributed.device_mesh import init_device_mesh

        from olmx_plugins.layers.moe.expert_parallel import apply_expert_parallel

        device = "cuda" if plan.world.device == "cuda" else "cpu"
        mesh = init_device_mesh(device, (plan.world.size // cfg.degree, cfg.degree),
                                mesh_dim_names=("ep_replicate", "ep_shard"))
        apply_expert_parallel(model, ep_mesh=mesh["ep_shard"], replicate_mesh=mesh["ep_replicate"])

    def apply_train_module(self, cfg: DDPEPConfig, train_module: dict[str, Any], plan: Any) -> None:
        """DDP for the dense part; gradient clipping moves to :meth:`callbacks` (OLMo-core's
        refuses the mix of plain and expert DTensor gradients)."""
        super().apply_train_module(cfg, train_module, plan)
        train_module["max_grad_norm"] = None

    def callbacks(self, cfg: DDPEPConfig, plan: Any) -> dict[str, Any]:
        """Mixed dense/expert gradient clipping."""
        norm = plan.config["trainer"]["max_grad_norm"]
        if norm is None:
            return {}
        from olmx_plugins.layers.moe.callbacks import MixedGradClipCallback

        return {"ddp_ep_grad_clip": MixedGradClipCallback(max_norm=norm)}


DDP_EP = DDPExpertParallel(name="ddp_ep", description=__doc__.splitlines()[0], config=DDPEPConfig,
                           summary="dense parameters replicated (DDP), experts sharded", dp_type="ddp")
