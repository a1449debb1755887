"""Plugin kinds, a leaf every stage reads: their entry-point groups, their config groups and
sections (:func:`config_section`, the one rule), which kinds a run selects one of, and the order
in which the core calls a run's plugins (:data:`KIND_ORDER`, :func:`plugins_in_order`). Re-exported by :mod:`olmx.api`
for plugin authors; the core imports it from here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from olmx.api import Plugin
    from olmx.config.schema import RunConfig
    from olmx.registry import Registry

__all__ = [
    "GROUPS",
    "CONFIG_GROUPS",
    "SINGLE_KINDS",
    "config_section",
    "KIND_ORDER",
    "MODEL_KINDS",
    "plugins_in_order",
    "DEFAULT_LAYER_ORDER",
]

#: Plugin kind -> entry-point group.
GROUPS: dict[str, str] = {
    "layer": "olmx.layers",
    "parallel": "olmx.parallel",
    "precision": "olmx.precision",
    "infra": "olmx.infra",
    "tracker": "olmx.trackers",
}

#: Plugin kind -> Hydra config group holding its options (and the RunConfig field).
CONFIG_GROUPS: dict[str, str] = {
    "layer": "layers",
    "parallel": "parallel",
    "precision": "precision",
    "infra": "infra",
    "tracker": "trackers",
}

#: Kinds of which a run selects exactly one plugin. Their section is flat, the choice and its
#: settings side by side (``precision=mxfp8 precision.emulate=true``, ``infra=slurm
#: infra.nodes=2``); the other kinds are lists with one section per plugin (``layers=[engram]
#: layers.engram.n=3``). :func:`config_section` is the one rule.
SINGLE_KINDS: tuple[str, ...] = ("precision", "infra")


def config_section(kind: str, name: str) -> str:
    """The run-config key of plugin ``name`` of ``kind``: the group itself for a single-choice
    kind (``precision``, ``infra``), else ``group.name`` (``layers.moe``, ``parallel.fsdp``)."""
    group = CONFIG_GROUPS[kind]
    return group if kind in SINGLE_KINDS else f"{group}.{name}"


#: The one order in which the core calls a run's plugins, by kind (within ``layer``: by
#: :attr:`LayerPlugin.order`), for every hook: ``resolve``, the model's edits
#: (``apply_model_config``, ``apply_model``), ``apply_train_module`` and ``callbacks``
#: (:func:`plugins_in_order`). Inner to outer: a layer's modules exist before the precision
#: plugin swaps their linear layers, and both before a parallel strategy wraps or shards the
#: model; trackers last, they only record the run. The train module's edits set fields of their
#: own (layers their optimizer groups and ``ep_config``, parallel strategies ``dp_config``,
#: ``cp_config``, ``tp_config``, ``pp_config``; the core applies the plan's dtypes after all of
#: them), so the same order holds there.
KIND_ORDER: tuple[str, ...] = ("layer", "precision", "parallel", "tracker")
#: The kinds whose plugins edit the model (trackers only record it).
MODEL_KINDS: tuple[str, ...] = ("layer", "precision", "parallel")


def plugins_in_order(run: RunConfig, reg: Registry, kinds: tuple[str, ...] = KIND_ORDER) -> list[tuple[Plugin, Any]]:
    """``(plugin, cfg)`` of the run's plugins of ``kinds``, in :data:`KIND_ORDER` (layers by
    their ``order``, then as listed): the one order in which the core calls their hooks."""
    out: list[tuple[Plugin, Any]] = []
    for kind in KIND_ORDER:
        if kind not in kinds:
            continue
        if kind == "layer":
            out += [(plugin, cfg) for _, plugin, cfg in reg.layers_in_order(run.layers)]
        else:
            out += [(reg.get(kind, name), cfg) for name, cfg in getattr(run, CONFIG_GROUPS[kind]).items()]
    return out


#: ``order`` of a layer plugin that does not set one.
DEFAULT_LAYER_ORDER = 50
