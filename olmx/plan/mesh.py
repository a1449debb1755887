"""Resolve's mesh pass, the one place the mesh is decided and validated (as torchtitan's
``ParallelDims``): the parallel plugins' claims (non-data-parallel dimensions), the one
data-parallel strategy's layout of the ranks left, every size checked against the world, and
the result frozen as :class:`olmx.api.Mesh`, which plugins then read as capabilities. Expert
parallelism's need of a layer with experts is checked here too, once the layers are known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from olmx.api import CLAIMABLE_DIMS, Context, Mesh, World
from olmx.errors import ConfigError, OlmxError

if TYPE_CHECKING:
    from olmx.config.schema import RunConfig
    from olmx.registry import Registry


def installed_with(reg: Registry, kind: str, capability: str) -> list[str]:
    """Names of the installed plugins of ``kind`` whose class sets ``capability``."""
    names = []
    for entry in reg.entries(kind):
        if not entry.usable:
            continue
        try:
            plugin = reg.get(kind, entry.name)
        except OlmxError:
            continue
        if getattr(plugin, capability, False):
            names.append(entry.name)
    return names


def check_experts(ctx: Context, reg: Registry) -> None:
    """Expert parallelism needs exactly one layer that places experts over ``mesh.ep``."""
    have = [p.name for p, _ in ctx.layers if p.experts]
    if not have:
        offer = " or ".join(f"layers=[{n}]" for n in installed_with(reg, "layer", "experts"))
        raise ConfigError(
            ctx.mesh.ep_field,
            f"expert parallelism needs a layer with experts: add "
            f"{offer or 'a layer plugin with experts (none is installed)'}",
        )
    if len(have) > 1:
        raise ConfigError(
            ctx.mesh.ep_field,
            f"expert parallelism places the experts of one layer plugin, "
            f"this run has {len(have)} with experts: {', '.join(have)}",
        )


def resolve_mesh(run: RunConfig, world: World, parallel: list[tuple[Any, Any]], reg: Registry) -> Mesh:
    """Resolve's first pass: the parallel plugins' claims and the data-parallel strategy's
    layout, validated once against the world."""
    claimed: dict[str, tuple[int, str]] = {}
    for plugin, cfg in parallel:
        for dim, size in plugin.claim(cfg, run, world).items():
            if dim not in CLAIMABLE_DIMS:
                raise ConfigError(
                    plugin.section,
                    f"claims mesh dimension '{dim}'; claimable: "
                    f"{', '.join(f'{k} ({v})' for k, v in CLAIMABLE_DIMS.items())}",
                )
            if dim in claimed:
                raise ConfigError(plugin.section, f"mesh dimension '{dim}' is already claimed by {claimed[dim][1]}")
            if size < 1:
                raise ConfigError(plugin.section, f"mesh dimension '{dim}' must be at least 1, got {size}")
            claimed[dim] = (size, plugin.section)
    cp = claimed.get("cp", (1, ""))[0]
    if world.size % cp:
        raise ConfigError(
            claimed["cp"][1],
            f"cp={cp} must divide the world size {world.size} "
            f"({world.nnodes} node(s) x {world.nproc_per_node} processes)",
        )
    dp_ranks = world.size // cp
    strategies = [(p, cfg) for p, cfg in parallel if p.data_parallel]
    if len(strategies) > 1:
        raise ConfigError(
            "parallel", f"choose one data-parallel strategy, got {', '.join(p.name for p, _ in strategies)}"
        )
    if not strategies:
        if world.size > 1:
            offer = installed_with(reg, "parallel", "data_parallel")
            raise ConfigError(
                "parallel",
                f"{world.size} processes need a data-parallel strategy to keep replicas in "
                f"sync (without one OLMo-core trains diverging copies); add one of: {', '.join(offer) or 'none'} "
                f"(e.g. parallel=[{offer[0] if offer else '...'}]) or run one process (infra.nproc_per_node=1)",
            )
        return Mesh(cp=cp)
    plugin, cfg = strategies[0]
    lay = plugin.layout(cfg, dp_ranks, world)
    if lay.replicate * lay.shard != dp_ranks or min(lay.replicate, lay.shard, lay.ep) < 1:
        raise ConfigError(
            plugin.section,
            f"lays out {lay.replicate} x {lay.shard} ranks, but there are {dp_ranks} data-parallel ranks",
        )
    if lay.ep > 1:
        if dp_ranks % lay.ep:
            raise ConfigError(
                lay.ep_field or plugin.section, f"{lay.ep} must divide the {dp_ranks} data-parallel ranks"
            )
        if cp > 1:
            raise ConfigError(
                lay.ep_field or plugin.section,
                f"expert parallelism (ep={lay.ep}) with context parallelism "
                f"(cp={cp}, {claimed['cp'][1]}) is not supported",
            )
    return Mesh(
        dp_replicate=lay.replicate,
        dp_shard=lay.shard,
        cp=cp,
        ep=lay.ep,
        shards_params=lay.shards_params,
        hybrid=lay.hybrid,
        ep_field=lay.ep_field or plugin.section,
    )
