"""Resolve's mesh pass, the one place the mesh is decided (as torchtitan's ``ParallelDims``):
the parallel plugins' claims (non-data-parallel dimensions), the one data-parallel strategy's
layout of the ranks left, and the result frozen as :class:`olmx.api.Mesh`, which plugins then
read as capabilities. The mesh's own structure (degrees, their product against the world, the
data-parallel factorisation, ``ep``) is checked by :meth:`Mesh.validate`; here, what the mesh
needs of the plugins: a claimable, unclaimed dimension, one data-parallel strategy (one that
shards parameters beside tensor parallelism), and, once the layers are known, a layer with
experts under expert parallelism and layers that support tensor and pipeline parallelism.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from olmx.errors import ConfigError, OlmxError
from olmx.types import CLAIMABLE_DIMS, Context, Mesh, World

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
    layout, the mesh validated once against the world (:meth:`Mesh.validate`)."""
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
            claimed[dim] = (size, plugin.section)
    cp, tp, pp = (claimed.get(dim, (1, ""))[0] for dim in ("cp", "tp", "pp"))
    fields = {dim: section for dim, (_, section) in claimed.items()}
    dp_ranks = Mesh(cp=cp, tp=tp, pp=pp).data_parallel_ranks(world, fields)
    strategies = [(p, cfg) for p, cfg in parallel if p.data_parallel]
    if len(strategies) > 1:
        raise ConfigError(
            "parallel", f"choose one data-parallel strategy, got {', '.join(p.name for p, _ in strategies)}"
        )
    if not strategies:
        if world.size > 1 and len(claimed):  # OLMo-core builds its mesh around a data-parallel config
            offer = installed_with(reg, "parallel", "data_parallel")
            if tp > 1:  # only a strategy that shards parameters wraps tensor-parallel slices
                offer = [n for n in offer if _provides(reg, n, "shard")]
            raise ConfigError(
                "parallel",
                f"{', '.join(f'{d}={n}' for d, (n, _) in claimed.items())} needs a data-parallel strategy beside it "
                f"(OLMo-core builds its device mesh around one, even over {dp_ranks} data-parallel rank(s)): "
                f"add one of {', '.join(offer) or 'none'}",
            )
        if world.size > 1:
            offer = installed_with(reg, "parallel", "data_parallel")
            raise ConfigError(
                "parallel",
                f"{world.size} processes need a data-parallel strategy to keep replicas in "
                f"sync (without one OLMo-core trains diverging copies); add one of: {', '.join(offer) or 'none'} "
                f"(e.g. parallel=[{offer[0] if offer else '...'}]) or run one process (infra.nproc_per_node=1)",
            )
        return Mesh(cp=cp, tp=tp, pp=pp).validate(world, fields)
    plugin, cfg = strategies[0]
    lay = plugin.layout(cfg, dp_ranks, world)
    if tp > 1 and not lay.shards_params:
        offer = [n for n in installed_with(reg, "parallel", "data_parallel") if _provides(reg, n, "shard")]
        raise ConfigError(
            plugin.section,
            f"keeps full replicas, which OLMo-core cannot wrap around tensor-parallel slices (tp={tp}, "
            f"{claimed['tp'][1]}); use a strategy that shards parameters over them: "
            f"{', '.join(offer) or 'none installed'}",
        )
    return Mesh(
        dp_replicate=lay.replicate,
        dp_shard=lay.shard,
        cp=cp,
        tp=tp,
        pp=pp,
        ep=lay.ep,
        shards_params=lay.shards_params,
        reshard_after_forward=lay.reshard_after_forward or not lay.shards_params,
        hybrid=lay.hybrid,
        ep_field=lay.ep_field or plugin.section,
    ).validate(world, fields | {"dp": plugin.section})


#: Mesh dimensions a layer plugin must declare support for: (dimension, the plugin's
#: capability, the parallelism's name, what goes wrong without it, what to do instead).
LAYER_DIMS = (
    (
        "tp",
        "tensor_parallel",
        "tensor",
        "its modules would meet sliced weights and a sequence-sharded residual stream",
        "drop the tensor-parallel strategy",
    ),
    (
        "pp",
        "pipeline_parallel",
        "pipeline",
        "its blocks would sit on stages that see only the previous stage's hidden states",
        "drop the pipeline strategy (shard with fsdp instead)",
    ),
)


def check_tensor_parallel(ctx: Context) -> None:
    """Tensor and pipeline parallelism need every layer plugin of the run to support them."""
    for plugin, _ in ctx.layers:
        for dim, capability, kind, why, instead in LAYER_DIMS:
            size = getattr(ctx.mesh, dim)
            if size > 1 and not getattr(plugin, capability):
                raise ConfigError(
                    plugin.section,
                    f"does not support {kind} parallelism (the mesh has {dim}={size}): {why}; "
                    f"{instead} or layers=[...,{plugin.name}]",
                )


def _provides(reg: Registry, name: str, capability: str) -> bool:
    try:
        return capability in reg.get("parallel", name).provides
    except OlmxError:
        return False
