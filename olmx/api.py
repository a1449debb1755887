"""The plugin contract (plugin API 2): base classes with documented no-op hooks.

A plugin is one object, an instance of the base class of its kind (:class:`LayerPlugin`,
:class:`ParallelPlugin`, :class:`PrecisionPlugin`, :class:`InfraPlugin`,
:class:`TrackerPlugin`), found through an
entry point in one of the groups of :data:`GROUPS`. It has a ``name`` (the entry-point name,
the Hydra option name and the config key are the same string), the plugin API range
``api`` it supports (a PEP 440 specifier such as ``">=3.0,<4"``,
checked against :data:`olmx.PLUGIN_API`), a dataclass ``Config`` (its config schema, every
field documented) and overrides of the hooks it needs. The registry checks a plugin against
its base class when it loads it; the core calls the hooks directly.

Plugins never name each other. They meet through capabilities that the core computes once:

* the :class:`Mesh` (resolve's first pass): parallel plugins claim mesh dimensions
  (:meth:`ParallelPlugin.claim`, :meth:`ParallelPlugin.layout`), the core validates them once
  against the world, as torchtitan's ``ParallelDims`` does. Everyone else reads
  ``mesh.shards_params``, ``mesh.shards_sequence`` / ``mesh.cp``, ``mesh.ep``, ``mesh.dp``;
* the :class:`Dtypes` (the precision plugin's :meth:`PrecisionPlugin.dtypes`): parameter /
  compute and reduction dtypes, applied by the core (FSDP mixed precision where the mesh
  shards parameters, ``torch.autocast`` elsewhere);
* :attr:`LayerPlugin.experts` (a layer with experts takes ``mesh.ep``). Parameters on a mesh
  of their own need no declaration: the core's gradient clipping takes the global norm
  across any meshes (:mod:`olmx.worker.clip`).

Resolve order: infra ``world``; parallel ``claim`` then the data-parallel strategy's
``layout`` (-> :class:`Mesh`); precision ``dtypes``; then every plugin's ``resolve`` against
the :class:`Context`, in :data:`KIND_ORDER` (layers by ``order``, precision, parallel,
trackers), the one order of every hook (the model's edits and ``apply_train_module`` too).
Decisions a plugin makes there go into :attr:`Contribution.decisions`, are saved in the plan
and read back at build time (:meth:`Plugin.decided`), never recomputed.

A ``Config`` field declares what it allows once, next to its definition, with
:func:`setting` (``top_k: int = setting(2, ge=1)``; a closed choice is a ``StrEnum``: ``gating: Gating =
setting(Gating.softmax)``): the core checks those rules before any hook sees the config, and
``olmx plugins show`` prints them. ``resolve`` checks only what joins several values.

Importing a plugin's module must be cheap: no torch and no OLMo-core at module level (import
them inside the ``apply_*``/``launch`` hooks). ``claim``, ``layout``, ``dtypes`` and
``resolve`` run before anything is launched or written, must not import torch, and raise
:class:`olmx.errors.ConfigError` naming the field and the numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from olmx.errors import ConfigError, LaunchError

# Re-exported for plugin authors: the plugin kinds and their config naming, the plan's value types
# and the field rules live in leaves of their own (olmx.kinds, olmx.types, olmx.rules).
from olmx.kinds import CONFIG_GROUPS as CONFIG_GROUPS
from olmx.kinds import DEFAULT_LAYER_ORDER as DEFAULT_LAYER_ORDER
from olmx.kinds import GROUPS as GROUPS
from olmx.kinds import KIND_ORDER as KIND_ORDER
from olmx.kinds import SINGLE_KINDS as SINGLE_KINDS
from olmx.kinds import config_section as config_section
from olmx.rules import setting as setting
from olmx.types import ADD_ON_CAPABILITIES as ADD_ON_CAPABILITIES
from olmx.types import CLAIMABLE_DIMS as CLAIMABLE_DIMS
from olmx.types import DTYPES as DTYPES
from olmx.types import FF_H as FF_H
from olmx.types import PARALLEL_CAPABILITIES as PARALLEL_CAPABILITIES
from olmx.types import PIPELINE_TOKEN_IDS as PIPELINE_TOKEN_IDS
from olmx.types import Context as Context
from olmx.types import Contribution as Contribution
from olmx.types import Dtypes as Dtypes
from olmx.types import Layout as Layout
from olmx.types import LinearLayer as LinearLayer
from olmx.types import Mesh as Mesh
from olmx.types import World as World

if TYPE_CHECKING:
    from olmx.config.schema import RunConfig
    from olmx.plan import Plan

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "PUBLIC_MODULES",
    "World",
    "Layout",
    "Mesh",
    "Dtypes",
    "Contribution",
    "LinearLayer",
    "Context",
    "Plugin",
    "LayerPlugin",
    "ParallelPlugin",
    "PrecisionPlugin",
    "InfraPlugin",
    "TrackerPlugin",
    "setting",
    "require_package",
    "config_section",
    "GROUPS",
    "CONFIG_GROUPS",
    "SINGLE_KINDS",
    "KIND_ORDER",
    "FF_H",
    "DEFAULT_LAYER_ORDER",
    "DTYPES",
    "CLAIMABLE_DIMS",
    "PARALLEL_CAPABILITIES",
    "ADD_ON_CAPABILITIES",
    "PIPELINE_TOKEN_IDS",
]


def require_package(package: str, *, extra: str, field: str) -> None:
    """Refuse the plan (:class:`ConfigError` naming ``field``) when ``package`` cannot be
    imported here: an optional part of olmx whose extra is not installed. Looked up, not
    imported (importing it may take seconds)."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ConfigError(field, f"needs the {package} package, which is not installed: pip install 'olmx[{extra}]'")


#: All of olmx a plugin may import: this contract and the few modules it declares public,
#: each of which lists its public names in ``__all__`` (an architecture test holds plugins to
#: it): errors; planning a run from overrides (a plugin's tests, its own commands); what an
#: infra target shares with the local one (the torchrun command, the run directory and its
#: events, following and diagnosing a launch, this machine's devices); the halo exchange a
#: token-local layer needs under a sequence-sharded mesh; the settings every ``transformers``
#: config olmx writes shares (a layer's ``hf_checkpoint``).
PUBLIC_MODULES: tuple[str, ...] = (
    "olmx",
    "olmx.api",
    "olmx.errors",
    "olmx.metrics",
    "olmx.console",
    "olmx.planning",
    "olmx.launch",
    "olmx.launch.devices",
    "olmx.launch.failures",
    "olmx.launch.monitor",
    "olmx.rundir",
    "olmx.events",
    "olmx.worker.halo",
    "olmx.worker.hf",
)


class Plugin:
    """What every plugin has. Subclass the base class of your kind, not this one.

    Its description, in ``olmx plugins list`` and ``show`` alike, is the first line of the
    docstring of the module its entry point names (read from the source, without importing it)."""

    #: The plugin kind (set by each base class).
    kind: ClassVar[str] = ""
    #: Entry-point name = Hydra option = config key.
    name: str = ""
    #: Plugin API range this plugin supports (PEP 440 specifier).
    api: str = ""
    #: The config dataclass (every field documented).
    Config: type = type(None)
    #: The dataclass of what ``resolve`` decides (every field documented), or None for a plugin
    #: that decides nothing or keeps plain data. The plan saves it as plain data and re-types
    #: it when read back, as it does ``Config``; :meth:`decided` returns the instance.
    Decisions: ClassVar[type | None] = None

    @property
    def section(self) -> str:
        """The plugin's config key in the run: ``layers.moe``, ``parallel.fsdp``, ``precision``,
        ``infra`` (:func:`config_section`)."""
        return config_section(self.kind, self.name)

    def resolve(self, cfg: Any, ctx: Context) -> Contribution:
        """Check ``cfg`` against the run; plan rows, parameters and decisions. Default: nothing."""
        return Contribution()

    def apply_train_module(self, cfg: Any, train_module: Any, plan: Plan, param_names: tuple[str, ...]) -> Any:
        """Return OLMo-core's ``TransformerTrainModuleConfig`` edited for this plugin (in
        :data:`KIND_ORDER`), as :meth:`LayerPlugin.apply_model_config` returns the model's
        config: the core's settings (optimizer, schedule) are in it, each plugin sets its part
        (``dp_config``, ``tp_config``, an ``OptimGroupOverride`` on ``optim``...).
        ``param_names`` are the built model's parameter names (``blocks.0.attention.w_q.weight``),
        which an optimizer group's patterns are matched against: the core refuses a group this
        plugin adds whose pattern matches none, naming the plugin. Default: unchanged."""
        return train_module

    def callbacks(self, cfg: Any, plan: Plan) -> dict[str, Any]:
        """OLMo-core trainer callbacks this plugin adds (name -> ``Callback``). Default: none."""
        return {}

    def decided(self, plan: Plan) -> Any:
        """The :attr:`Contribution.decisions` this plugin's ``resolve`` recorded in ``plan``: an
        instance of :attr:`Decisions` (a plain dict for a plugin without one; ``{}`` if none)."""
        return plan.decisions.get(self.section, {})


class LayerPlugin(Plugin):
    """Edits the model: its OLMo-core config, or the built model before parallelism."""

    kind = "layer"
    #: Where the plugin edits the model among the run's layer plugins, lowest first (ties keep
    #: the listed order). Plugins that replace parts of a block go before those that extend
    #: whatever block is there, so the order a user lists them in does not matter.
    order: ClassVar[int] = DEFAULT_LAYER_ORDER
    #: The layer has experts and places them over ``mesh.ep`` ranks when the data-parallel
    #: strategy asks for expert parallelism (it owns expert parallelism; exactly one such layer).
    experts: ClassVar[bool] = False
    #: The layer's modules work when the blocks' weights are sharded over ``mesh.tp`` ranks
    #: (tensor parallelism turns the residual stream into sequence-sharded DTensors and the
    #: block's linear layers into slices). Unless a layer says so, the plan refuses it under
    #: tensor parallelism.
    tensor_parallel: ClassVar[bool] = False
    #: The layer's modules work on a pipeline stage: a block that holds them may sit on any
    #: stage, seeing the previous stage's hidden states (and the micro-batch's token ids under
    #: :data:`PIPELINE_TOKEN_IDS`, where the layer needs them). Unless a layer says so, the plan
    #: refuses it under pipeline parallelism (``mesh.pp``).
    pipeline_parallel: ClassVar[bool] = False

    def linear_layers(self, cfg: Any, ctx: Context, layers: list[LinearLayer]) -> list[LinearLayer]:
        """The model's ``nn.Linear`` layers after this plugin's edits (torch-free,
        :mod:`olmx.plan.linears`), which precision plugins plan with. Default: unchanged."""
        return layers

    def apply_model_config(self, cfg: Any, model_config: Any, plan: Plan) -> Any:
        """Return the OLMo-core ``TransformerConfig`` edited for this layer. Default: unchanged."""
        return model_config

    def apply_model(self, cfg: Any, model: Any, plan: Plan) -> None:
        """Edit the built (meta-device) model in place, before activation checkpointing,
        compile and data parallelism, in the order OLMo-core's ``parallelize_model`` uses.
        Under pipeline parallelism ``model`` is each of the rank's stages after the split (a
        ``Transformer`` holding only its blocks, the embedding on the first stage, the output
        head on the last; block names keep their index). Default: nothing."""

    def hf_architecture(self, cfg: Any, run: RunConfig) -> str:
        """The ``transformers`` causal-LM class (``"OlmoeForCausalLM"``) that holds a model with
        this layer, for ``olmx export hf``: decided without torch, before anything is loaded;
        raise :class:`~olmx.errors.ConfigError` naming the setting that has none. Default: none
        (the layer adds blocks no ``transformers`` architecture has)."""
        raise ConfigError(
            "layers",
            f"layers=[...,{self.name}] adds blocks that no Hugging Face transformers architecture has, and olmx "
            "writes no remote code for them; olmx export torch writes the full state dict of any model",
        )

    def hf_checkpoint(self, cfg: Any, model: Any, plan: Plan) -> tuple[Any, dict[str, Any]]:
        """The ``transformers`` config and state dict (full tensors on the CPU) of the built
        model with its weights loaded, for the class :meth:`hf_architecture` named. The core
        sets the run's token ids and context length, loads the state into that class strictly
        (every tensor, nothing left over) and saves it. Called only where
        :meth:`hf_architecture` named a class."""
        raise NotImplementedError(f"{self.name} names a transformers class but writes no checkpoint for it")


class ParallelPlugin(Plugin):
    """A parallel strategy: claims mesh dimensions and fills its part of OLMo-core's
    train-module config (``dp_config``, ``cp_config``, ...)."""

    kind = "parallel"
    #: True for the strategy that keeps replicas in sync (ddp, fsdp, ...): it lays out the
    #: data-parallel ranks (:meth:`layout`); exactly one is needed when the world has more
    #: than one data-parallel rank.
    data_parallel: ClassVar[bool] = False
    #: What the strategy provides (keys of :data:`PARALLEL_CAPABILITIES`); ``parallel=auto``
    #: chooses among the installed strategies by these, never by name. Default: nothing
    #: (``parallel=auto`` never picks the strategy).
    provides: ClassVar[tuple[str, ...]] = ()

    def options(self, cfg: Any, run: RunConfig, world: World) -> list[tuple[str, Any]]:
        """The concrete settings this strategy can run with for the plan's ``auto`` choices,
        cheapest first, as ``(override, cfg)`` pairs (``("parallel.ulysses.degree=2", cfg)``;
        an empty override: the settings as given). ``cfg`` is the user's settings, whose
        ``auto`` fields you expand (``parallel.ulysses.degree=auto``), or None when
        ``parallel=auto`` picked the strategy: offer every setting worth trying. The plan
        checks each option as it checks any run (``claim``, ``layout``, ``resolve``, memory).
        Default: the settings as given, or the defaults."""
        return [("", self.Config() if cfg is None else cfg)]

    def claim(self, cfg: Any, run: RunConfig, world: World) -> dict[str, int]:
        """Non-data-parallel mesh dimensions this strategy takes (keys of
        :data:`CLAIMABLE_DIMS`, e.g. ``{"cp": 2}``); they multiply into the world, the
        data-parallel strategy lays out the ranks left. Check the strategy's own settings
        here. Default: none."""
        return {}

    def layout(self, cfg: Any, dp_ranks: int, world: World) -> Layout:
        """(Data-parallel strategies) how the ``dp_ranks`` data-parallel ranks are laid out.
        Default: plain replicas."""
        return Layout(replicate=dp_ranks)

    def apply_model(self, cfg: Any, model: Any, plan: Plan) -> None:
        """Edit the built model in place after the layer and precision plugins (e.g. wrap the
        attention for sequence parallelism). Under pipeline
        parallelism: each stage of the rank (as :meth:`LayerPlugin.apply_model`). Default: nothing."""


class PrecisionPlugin(Plugin):
    """A precision backend: its dtypes, and module swaps such as FP8 linear layers."""

    kind = "precision"

    def dtypes(self, cfg: Any, run: RunConfig, world: World, mesh: Mesh) -> Dtypes:
        """Parameter/compute and reduction dtypes for this mesh (the core checks and applies
        them). Default: float32 throughout."""
        return Dtypes()

    def apply_model(self, cfg: Any, model: Any, plan: Plan) -> None:
        """Edit the built model after the layer plugins, before any parallelism (where
        OLMo-core's ``parallelize_model`` applies ``float8_config``). Under pipeline
        parallelism: each stage of the rank (as :meth:`LayerPlugin.apply_model`). Default: nothing."""


class InfraPlugin(Plugin):
    """Starts the processes of a finished plan; never composes config again."""

    kind = "infra"

    def world(self, cfg: Any) -> World:
        """The processes the run will have with these settings (check them here)."""
        raise NotImplementedError

    def dry_run(self, cfg: Any, plan: Plan) -> str:
        """Exactly what :meth:`launch` would run (commands, scripts, request bodies)."""
        raise NotImplementedError

    def launch(self, cfg: Any, plan: Plan) -> int:
        """Start the run, follow it until it ends (or until it is detached), and return its
        exit code."""
        raise NotImplementedError

    def data_on_this_machine(self, cfg: Any) -> bool:
        """False when ``data.paths`` name files on the target's machines instead of this one,
        so the plan does not look for them here. Default: True."""
        return True

    def reports_here(self, cfg: Any) -> bool:
        """Whether the ``olmx train`` that launched the run writes its report when the launch
        returns: False for a detached job (it has not run yet) and for all but one launcher of
        a run. Default: True."""
        return True

    def owns_run_dir(self, cfg: Any) -> bool:
        """Whether the ``olmx train`` that launches with these settings owns the run directory:
        takes its lock (one writer per run directory, :meth:`olmx.rundir.RunDir.acquire`),
        claims it and records the launch. False for all but one launcher of a run that is
        started by hand on several machines sharing the directory (they use it under the
        owner's lock). Default: True."""
        return True

    def preflight(self, cfg: Any, plan: Plan) -> None:
        """Checks that need this machine's state rather than the config (credentials, tools on
        ``PATH``), run by ``olmx train`` after it printed the plan and before it takes the lock
        or writes anything; not run by ``--dry-run``. Raise :class:`olmx.errors.ConfigError`
        naming what is missing. Default: nothing."""

    def commands(self) -> Any:
        """A ``typer.Typer`` of ``olmx provision <name> ...`` sub-commands (loaded only when
        invoked), or None. An :class:`olmx.errors.OlmxError` they raise becomes one message."""
        return None

    def job_status(self, cfg: Any, plan: Plan) -> str:
        """``olmx jobs status RUN_DIR``: where the launched run is."""
        raise LaunchError(f"runs on infra '{self.name}' are followed by the olmx train that started them")

    def job_logs(self, cfg: Any, plan: Plan, lines: int) -> str:
        """``olmx jobs logs RUN_DIR``: the last ``lines`` lines of the run's log."""
        raise LaunchError(f"runs on infra '{self.name}' are followed by the olmx train that started them")

    def job_cancel(self, cfg: Any, plan: Plan) -> None:
        """``olmx jobs cancel RUN_DIR``: cancel the launched run."""
        raise LaunchError(f"runs on infra '{self.name}' are followed by the olmx train that started them")


class TrackerPlugin(Plugin):
    """Records the run somewhere for people to look at: every metric the trainer logs, the
    resolved config and the plan (TensorBoard event files, a W&B run, an MLflow experiment).

    Several per run (``trackers=[tensorboard,wandb]``). ``resolve(cfg, ctx)`` checks the
    settings and states in its rows where the data goes (``("writes", "offline: RUN_DIR/...")``
    or ``("sends", "online: <host>")``); a tracker sends nothing anywhere unless its settings ask
    for it. ``callbacks(cfg, plan)`` returns the OLMo-core ``Callback`` objects that record: the
    core adds them to rank 0's trainer only (the trainer reduces metrics onto rank 0), where
    ``log_metrics(step, metrics)`` receives every metric recorded at that step (``train/CE
    loss``, ``optim/LR (group 0)``, whatever the trainer and other callbacks record) and
    ``post_train``/``close`` flush. ``plan.to_dict()`` is the plan as plain data (the resolved
    config under ``config``); ``plan.resume_step`` says from which step a resumed run records
    again (drop or replace what an earlier attempt recorded after it)."""

    kind = "tracker"


#: Plugin kind -> its base class.
BASES: dict[str, type[Plugin]] = {
    "layer": LayerPlugin,
    "parallel": ParallelPlugin,
    "precision": PrecisionPlugin,
    "infra": InfraPlugin,
    "tracker": TrackerPlugin,
}
#: Hooks a plugin of each kind must override (the others have working defaults).
REQUIRED_HOOKS: dict[str, tuple[str, ...]] = {
    "layer": (),
    "parallel": (),
    "precision": (),
    "infra": ("world", "dry_run", "launch"),
    "tracker": ("callbacks",),
}
