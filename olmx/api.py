"""The plugin contracts.

A plugin is one object, found through an entry point in one of the four groups of
:data:`GROUPS`, with a ``name`` (the entry-point name, the Hydra option name and the config
key are the same string), a one-line ``description``, the plugin API range ``api`` it
supports (a PEP 440 specifier such as ``">=1.0,<2"``, checked against
:data:`olmx.PLUGIN_API`), a dataclass ``Config`` (its config schema; every field documented)
and the few methods of its kind below.

Importing a plugin's module must be cheap: no torch and no OLMo-core at module level (import
them inside the ``apply_*``/``launch`` methods). ``resolve`` runs before anything is launched
and must not import torch either; it checks the plugin's settings against the run and the
world and raises :class:`olmx.errors.ConfigError` naming the field and the numbers.

Optional hooks, called when a plugin has them (``cfg`` is the plugin's ``Config`` instance):

* ``callbacks(cfg, plan) -> dict[str, Callback]`` (any kind): OLMo-core trainer callbacks
  added to the run (e.g. MoE load statistics, Engram traffic).
* ``apply_train_module(cfg, kwargs, plan)`` (layers too): edit the keyword arguments of
  OLMo-core's ``TransformerTrainModuleConfig``; called for parallel, then precision, then layers.
* ``apply_model(cfg, model, plan)`` (precision, parallel): edit the built model in place after
  the layers did (float8 conversion; expert parallelism placing experts).
* ``order: int`` (layers): where the plugin edits the model among the run's layer plugins,
  lowest first (default :data:`DEFAULT_LAYER_ORDER`; ties keep the listed order). Plugins that
  replace parts of a block (``moe``: 10) go before those that extend whatever block is there
  (``engram``: 90), so the order a user lists them in does not matter.
* ``linear_layers(cfg, run, layers) -> layers`` (layers): edit the torch-free list of the
  model's ``nn.Linear`` layers (:mod:`olmx.plan.linears`) that precision plugins plan with.
* ``dp_mesh(cfg, dp_ranks, world) -> dict[str, int]`` (the data-parallel strategy): how its
  ranks split into mesh dimensions (``{"dp_replicate": 2, "dp_shard": 4}``).
* ``commands() -> typer.Typer`` (infra): the ``olmx provision <name> ...`` sub-commands,
  loaded only when invoked; an :class:`olmx.errors.OlmxError` they raise becomes one message
  and its exit code, as everywhere in the CLI.
* ``data_on_this_machine(cfg) -> bool`` (infra): False when ``data.paths`` name files on the
  target's machines instead of this one, so the plan does not look for them here.
* ``job_status(plan)``, ``job_logs(plan, lines)``, ``job_cancel(plan)`` (infra): what
  ``olmx jobs status|logs|cancel RUN_DIR`` run for a run launched on this target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from olmx.config.schema import RunConfig
    from olmx.plan import Plan

#: Plugin kind -> entry-point group. The config group of a kind is its key's plural
#: (``layers``, ``parallel``, ``precision``, ``infra``), see :data:`CONFIG_GROUPS`.
GROUPS: dict[str, str] = {
    "layer": "olmx.layers",
    "parallel": "olmx.parallel",
    "precision": "olmx.precision",
    "infra": "olmx.infra",
}

#: ``order`` of a layer plugin that does not set one (see the module docstring).
DEFAULT_LAYER_ORDER = 50

#: Plugin kind -> Hydra config group holding its options.
CONFIG_GROUPS: dict[str, str] = {
    "layer": "layers",
    "parallel": "parallel",
    "precision": "precision",
    "infra": "infra",
}


@dataclass(frozen=True)
class World:
    """The processes a run will have, as the infra plugin resolves them."""

    #: Number of machines.
    nnodes: int
    #: Processes started on each machine (one per GPU, or CPU processes).
    nproc_per_node: int
    #: ``"cpu"`` or ``"cuda"``.
    device: str = "cpu"
    #: Human-readable device name, e.g. ``"NVIDIA H100 80GB HBM3"``; ``"cpu"`` on CPUs.
    device_name: str = "cpu"
    #: CUDA compute capability ``(major, minor)`` where known (``None`` on CPU or unknown).
    compute_capability: tuple[int, int] | None = None

    @property
    def size(self) -> int:
        """Total number of processes."""
        return self.nnodes * self.nproc_per_node


@dataclass
class Contribution:
    """What a plugin's ``resolve`` adds to the plan."""

    #: ``(label, value)`` rows shown under the plugin's name in the printed plan.
    rows: list[tuple[str, str]] = field(default_factory=list)
    #: Device-mesh dimensions this plugin claims, e.g. ``{"dp_shard": 2}``.
    mesh: dict[str, int] = field(default_factory=dict)
    #: True for the strategy that keeps replicas in sync (ddp, fsdp, hsdp, ...): exactly one
    #: is required when the world has more than one process.
    data_parallel: bool = False
    #: Parameters this plugin adds to the model (layers), and how many of them are active
    #: for one token.
    params: int = 0
    active_params: int = 0


@runtime_checkable
class Plugin(Protocol):
    """What every plugin has."""

    name: str
    description: str
    api: str
    Config: ClassVar[type]


@runtime_checkable
class LayerPlugin(Plugin, Protocol):
    """Edits the model: its OLMo-core config, or the built model before parallelism."""

    def resolve(self, cfg: Any, run: RunConfig, world: World) -> Contribution:
        """Check ``cfg`` against the run; report added parameters and plan rows."""

    def apply_model_config(self, cfg: Any, model_config: Any, plan: Plan) -> Any:
        """Return the OLMo-core ``TransformerConfig`` edited for this layer type."""

    def apply_model(self, cfg: Any, model: Any, plan: Plan) -> None:
        """Edit the built model in place. Called before activation checkpointing,
        compile and data parallelism, in the order OLMo-core's ``parallelize_model`` uses."""


@runtime_checkable
class ParallelPlugin(Plugin, Protocol):
    """A parallel strategy: fills its part of OLMo-core's train-module config."""

    def resolve(self, cfg: Any, run: RunConfig, world: World) -> Contribution:
        """Check degrees against the world and the model; claim mesh dimensions."""

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Plan) -> None:
        """Set ``dp_config`` / ``cp_config`` / ``ep_config`` ... in the keyword arguments of
        OLMo-core's ``TransformerTrainModuleConfig``."""


@runtime_checkable
class PrecisionPlugin(Plugin, Protocol):
    """A precision backend: autocast, parameter / reduce dtypes, float8 configs."""

    def resolve(self, cfg: Any, run: RunConfig, world: World) -> Contribution:
        """Check the hardware and the model; state what is kept in which dtype."""

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Plan) -> None:
        """Set the precision fields of the train-module keyword arguments."""


@runtime_checkable
class InfraPlugin(Plugin, Protocol):
    """Starts the processes of a finished plan; never composes config again."""

    def world(self, cfg: Any) -> World:
        """The processes the run will have with these settings."""

    def dry_run(self, plan: Plan) -> str:
        """Exactly what :meth:`launch` would run (commands, scripts, request bodies)."""

    def launch(self, plan: Plan) -> int:
        """Start the run, follow it until it ends, and return its exit code."""


#: Methods each kind must have, checked when a plugin is loaded.
REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    "layer": ("resolve", "apply_model_config", "apply_model"),
    "parallel": ("resolve", "apply_train_module"),
    "precision": ("resolve", "apply_train_module"),
    "infra": ("world", "dry_run", "launch"),
}
