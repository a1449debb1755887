"""Halfcast: bfloat16 compute, and bfloat16 gradient reduction wherever parameters are sharded.

The precision plugin ``halfcast`` decides only the run's dtypes from the mesh's capabilities
(:class:`olmx.api.Mesh`): where the data-parallel strategy shards parameters
(``mesh.shards_params``: fsdp, hsdp or any third-party strategy that says so) the gradients
are reduce-scattered in bfloat16, which halves the reduction traffic of the float32 default;
where parameters are replicated the reduction stays float32 (DDP all-reduces the float32
gradients of float32 master weights). olmx's core applies the dtypes (FSDP2's mixed-precision
policy, or ``torch.autocast``) and every other plugin sees them: the sequence-parallel plan
counts 2-byte activations, layers see ``ctx.dtypes``. Master weights and optimizer state stay
float32.

This module imports no torch: olmx imports it to list and configure plugins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Dtypes, Mesh, PrecisionPlugin, World
from olmx.errors import ConfigError


@dataclass(frozen=True)
class HalfcastConfig:
    """Settings of ``precision``."""

    #: Reduce gradients in bfloat16 where the data-parallel strategy shards parameters.
    half_reduce: bool = True
    #: Refuse a run whose parameters are replicated (where the reduction stays float32).
    require_sharding: bool = False


class HalfcastPrecision(PrecisionPlugin):
    """bfloat16 compute; bfloat16 reduction where the mesh shards parameters."""

    name = "halfcast"
    api = ">=3.0,<4"
    Config = HalfcastConfig

    def dtypes(self, cfg: HalfcastConfig, run: Any, world: World, mesh: Mesh) -> Dtypes:
        """bfloat16 compute; the reduction by what the mesh can do."""
        if cfg.require_sharding and world.size > 1 and not mesh.shards_params:
            raise ConfigError(
                "precision.require_sharding",
                f"the {mesh.dp} data-parallel ranks keep full replicas, so gradients would be "
                "reduced in float32; use a data-parallel strategy that shards parameters, or "
                "set precision.require_sharding=false",
            )
        half = cfg.half_reduce and mesh.shards_params
        return Dtypes(param="bfloat16", reduce="bfloat16" if half else "float32")

    def resolve(self, cfg: HalfcastConfig, ctx: Context) -> Contribution:
        """What runs in which dtype, and the reduction traffic it saves."""
        rows = ctx.dtype_rows()
        if ctx.dtypes.reduce == "bfloat16":
            rows.append(("reduction traffic", "half of float32's (bfloat16 reduce-scatter)"))
        elif ctx.world.size > 1:
            rows.append(("reduction traffic", "float32: parameters are replicated on this mesh"))
        return Contribution(rows=rows)


#: The plugin object the entry point names.
HALFCAST = HalfcastPrecision()
