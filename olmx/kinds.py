"""Plugin kinds, a leaf every stage reads: their entry-point groups, their config groups and
sections (:func:`config_section`, the one rule), which kinds a run selects one of, and the order
in which the core calls a run's plugins (:data:`KIND_ORDER`). Re-exported by :mod:`olmx.api`
for plugin authors; the core imports it from here."""

from __future__ import annotations

__all__ = [
    "GROUPS",
    "CONFIG_GROUPS",
    "SINGLE_KINDS",
    "config_section",
    "KIND_ORDER",
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


#: The order in which the core calls ``resolve``, ``apply_train_module`` and ``callbacks`` of
#: a run's plugins, by kind (within ``layer``: by :attr:`LayerPlugin.order`). Parallel plugins
#: set the train module's parallel configs, the precision plugin adds to them, layers after them
#: (optimizer groups of their own parameters); trackers last: they only record the run.
KIND_ORDER: tuple[str, ...] = ("parallel", "precision", "layer", "tracker")

#: ``order`` of a layer plugin that does not set one.
DEFAULT_LAYER_ORDER = 50
