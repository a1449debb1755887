"""The plugin contract (plugin API 2): base classes with documented no-op hooks.

A plugin is one object, an instance of the base class of its kind (:class:`LayerPlugin`,
:class:`ParallelPlugin`, :class:`PrecisionPlugin`, :class:`InfraPlugin`,
:class:`TrackerPlugin`), found through an
entry point in one of the groups of :data:`GROUPS`. It has a ``name`` (the entry-point name,
the Hydra option name and the config key are the same string), a one-line ``description``,
the plugin API range ``api`` it supports (a PEP 440 specifier such as ``">=3.0,<4"``,
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
the :class:`Context`, in :data:`KIND_ORDER` (parallel, precision, layers by ``order``,
trackers).
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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from olmx.config.rules import setting as setting  # re-exported: the plugin contract
from olmx.errors import ConfigError, LaunchError

if TYPE_CHECKING:
    from olmx.config.schema import RunConfig
    from olmx.plan import Plan
    from olmx.plan.execution import Execution

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
#: token-local layer needs under a sequence-sharded mesh.
PUBLIC_MODULES: tuple[str, ...] = (
    "olmx",
    "olmx.api",
    "olmx.errors",
    "olmx.planning",
    "olmx.launch",
    "olmx.launch.devices",
    "olmx.launch.failures",
    "olmx.launch.monitor",
    "olmx.rundir",
    "olmx.events",
    "olmx.worker.halo",
)

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

#: h-wide tensors per token a SwiGLU feed-forward of hidden width h keeps for its backward
#: pass (the two projections' outputs, the SiLU and the product): what the memory model
#: counts, and what a layer plugin with SwiGLU experts counts in its activation estimate.
FF_H = 4

#: ``order`` of a layer plugin that does not set one.
DEFAULT_LAYER_ORDER = 50

#: dtypes a precision plugin may choose for parameters/compute and reductions.
DTYPES: tuple[str, ...] = ("bfloat16", "float32")

#: Non-data-parallel mesh dimensions a parallel plugin may claim in :meth:`ParallelPlugin.claim`.
CLAIMABLE_DIMS: dict[str, str] = {
    "cp": "context (sequence) parallel: each sequence sharded over this many ranks",
    "tp": "tensor parallel: each block's weights sharded over this many ranks",
    "pp": "pipeline parallel: the blocks split into this many consecutive stages, one group of ranks each",
}

#: What a parallel plugin may say it provides (:attr:`ParallelPlugin.provides`), in the order
#: ``parallel=auto`` prefers them (least communication first; the plan's memory estimate decides
#: whether a layout fits): data-parallel kinds, then what a strategy adds to one.
PARALLEL_CAPABILITIES: dict[str, str] = {
    "replicate": "data parallel: a full replica of the model on every rank, gradients all-reduced",
    "experts": "data parallel with the experts of a layer with experts split over ranks (expert parallel)",
    "hybrid": "data parallel: parameters, gradients and optimizer state sharded within a node, replicated across",
    "shard": "data parallel: parameters, gradients and optimizer state sharded over all data-parallel ranks",
    "sequence": "sequence parallel: each sequence split over a group of ranks (claims cp)",
    "tensor": "tensor parallel: each block's weight matrices sliced over a group of ranks (claims tp)",
    "pipeline": "pipeline parallel: the blocks split into consecutive stages over groups of ranks (claims pp)",
}
#: The kinds of :data:`PARALLEL_CAPABILITIES` a strategy adds to a data-parallel one (the others
#: are data-parallel kinds); ``parallel=auto`` adds one of them, sequence before tensor before
#: pipeline, or tensor and pipeline together after them.
ADD_ON_CAPABILITIES: tuple[str, ...] = ("sequence", "tensor", "pipeline")
#: Under pipeline parallelism, the keyword argument of every stage's model forward (OLMo-core's
#: ``Transformer.forward``, which hands unknown keywords to ``_prepare_inputs`` and drops them
#: there) that holds the micro-batch's token ids ``[B, T]``: a stage after the first receives
#: hidden states in place of ``input_ids``, and a layer that reads the tokens (Engram's hashed
#: n-grams) takes them from here.
PIPELINE_TOKEN_IDS = "pipeline_token_ids"


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
    #: Memory one process may use, in GiB, where known: one GPU's memory, or on CPUs this
    #: machine's RAM shared by its processes. The plan's memory estimate is checked against it.
    device_memory_gib: float | None = None
    #: What the plan should warn about this world (more processes than cores, ...).
    warnings: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Total number of processes."""
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True)
class Layout:
    """How the data-parallel strategy lays out the data-parallel ranks (:meth:`ParallelPlugin.layout`)."""

    #: Replica groups (each holds a full copy of the parameters, or of its shard group's).
    replicate: int
    #: Ranks one parameter is sharded over (1: not sharded).
    shard: int = 1
    #: Whether parameters, gradients and optimizer state are sharded (FSDP-like): a shard group
    #: of size 1 still counts, it is FSDP on one rank.
    shards_params: bool = False
    #: With :attr:`shards_params`: whether each block's parameters are freed after its forward
    #: and gathered again for its backward (FSDP, ZeRO-3). ``False`` gathers them once a step and
    #: keeps them from the forward to the backward (ZeRO-2: a distributed optimizer over what
    #: is otherwise a replicated layout; gradients and optimizer state stay sharded).
    reshard_after_forward: bool = True
    #: Expert-parallel degree: experts of a layer with :attr:`LayerPlugin.experts` are split
    #: over this many of the data-parallel ranks (1: no expert parallelism).
    ep: int = 1
    #: Show ``dp_replicate`` and ``dp_shard`` in the plan even where one of them is 1.
    hybrid: bool = False
    #: The config field that sets ``ep`` (``parallel.ddp_ep.degree``), named in messages.
    ep_field: str = ""


@dataclass(frozen=True)
class Mesh:
    """The run's device mesh and its capabilities, validated once against the world.

    ``dp_replicate x dp_shard x cp x tp`` ranks; experts (``ep``) are split over ``ep`` of the
    ``dp_replicate x dp_shard`` data-parallel ranks (OLMo-core's and torchtitan's layout)."""

    #: Replica groups of the data-parallel ranks.
    dp_replicate: int = 1
    #: Ranks one parameter is sharded over.
    dp_shard: int = 1
    #: Ranks that share one sequence (context / sequence parallelism).
    cp: int = 1
    #: Expert-parallel degree (within the data-parallel ranks).
    ep: int = 1
    #: Ranks that share every weight matrix of a block, each holding a slice (tensor
    #: parallelism; OLMo-core's ``tp_config``).
    tp: int = 1
    #: Pipeline stages: groups of ranks that each hold a consecutive slice of the blocks and pass
    #: activations forward and gradients back (pipeline parallelism; OLMo-core's ``pp_config``).
    pp: int = 1
    #: Parameters, gradients and optimizer state are sharded (FSDP2-like data parallelism).
    shards_params: bool = False
    #: With :attr:`shards_params`: parameters freed after each block's forward (ZeRO-3), or
    #: kept gathered until its backward (ZeRO-2; :attr:`Layout.reshard_after_forward`).
    reshard_after_forward: bool = True
    #: Show both data-parallel dimensions in the plan.
    hybrid: bool = False
    #: The config field that sets ``ep``, for messages (:attr:`Layout.ep_field`).
    ep_field: str = ""

    @property
    def dp(self) -> int:
        """Data-parallel ranks (each sees its own data)."""
        return self.dp_replicate * self.dp_shard

    @property
    def size(self) -> int:
        """All ranks."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def shards_sequence(self) -> bool:
        """Each sequence is split over ``cp`` ranks: token-local layers see ``seq_len / cp``
        positions per rank (:mod:`olmx.worker.halo` gives causal layers their left context)."""
        return self.cp > 1

    @property
    def shards_weights(self) -> bool:
        """Each block's weight matrices are split over ``tp`` ranks (tensor parallelism): a
        layer that adds its own modules to a block must shard them alike or refuse."""
        return self.tp > 1

    @property
    def expert_parallel(self) -> bool:
        """Experts are split over ``ep`` ranks."""
        return self.ep > 1

    def dims(self) -> dict[str, int]:
        """The dimensions as the plan shows them (``{"dp": 4}``, ``{"dp_replicate": 2, "dp_shard": 2, "cp": 2}``)."""
        out = (
            {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard}
            if self.hybrid or (self.dp_replicate > 1 and self.dp_shard > 1)
            else {"dp": self.dp}
        )
        if self.cp > 1:
            out["cp"] = self.cp
        if self.tp > 1:
            out["tp"] = self.tp
        if self.pp > 1:
            out["pp"] = self.pp
        if self.ep > 1:
            out["ep"] = self.ep
        return out

    def expert_mesh_shape(self) -> tuple[int, int]:
        """``(replicas, ep)``: the 2-D mesh experts are placed on within one pipeline stage
        (replicas of each EP group, the EP group); consecutive ranks form an EP group. Under
        pipeline parallelism each stage's ranks hold this mesh (``(pp, replicas, ep)`` over the
        world, the stages outermost as OLMo-core orders its mesh)."""
        return self.dp // self.ep, self.ep


@dataclass(frozen=True)
class Dtypes:
    """What the precision plugin decided (:meth:`PrecisionPlugin.dtypes`); the core applies it.

    Master weights and optimizer state are always float32."""

    #: dtype parameters are computed in: where the mesh shards parameters, the dtype FSDP
    #: all-gathers the float32 master shards into; elsewhere the ``torch.autocast`` dtype
    #: (float32: no autocast).
    param: str = "float32"
    #: dtype of the gradient reduction across ranks (anything but float32 needs a mesh that
    #: shards parameters: DDP all-reduces the float32 gradients of float32 parameters).
    reduce: str = "float32"

    @property
    def compute_bytes(self) -> int:
        """Bytes per activation element in the layers the precision plugin does not replace."""
        return 4 if self.param == "float32" else 2


@dataclass
class Contribution:
    """What a plugin's ``resolve`` adds to the plan."""

    #: ``(label, value)`` rows shown under the plugin's name in the printed plan.
    rows: list[tuple[str, str]] = field(default_factory=list)
    #: Parameters this plugin adds to the model (layers), and how many of them are active
    #: for one token.
    params: int = 0
    active_params: int = 0
    #: Of ``params``, those the plugin spreads over ranks itself, outside DDP/FSDP (sharded
    #: Engram tables, experts under expert parallelism), and over how many ranks: each rank
    #: holds ``sharded_params / sharded_over`` of them with their gradients and optimizer
    #: state. The plan's memory estimate reads it.
    sharded_params: int = 0
    sharded_over: int = 1
    #: Parameters the plugin's modules gather for compute at a time beyond what DDP/FSDP gather
    #: (experts stored in shards and all-gathered a layer at a time, the next one prefetched), in
    #: the compute dtype. The plan's memory estimate holds them as buffers.
    gathered_params: int = 0
    #: Bytes per token of a micro-batch on each rank (after sequence sharding) that this
    #: plugin's modules keep for backward beyond OLMo-core's llama-like blocks (negative where
    #: they keep less), summed over the blocks they change, under the run's
    #: ``trainer.activation_checkpointing``. The plan's memory estimate adds them. (A layer's
    #: transient communication buffers, such as an all-to-all, need no term: they are freed
    #: before the peak at the start of the backward pass.)
    activation_bytes_per_token: int = 0
    #: Micro-batches whose activations a rank keeps at once, in whole stages' worth (a pipeline
    #: schedule runs several forwards before their backwards; 1 without a pipeline). The plan's
    #: memory estimate multiplies the activations of a rank's blocks by the largest.
    microbatches_in_flight: int = 1
    #: The share of each step the devices idle because of this plugin (a pipeline's bubble).
    #: The plan's time model stretches the step by ``1 / (1 - idle)`` for the largest.
    idle_fraction: float = 0.0
    #: Decisions made here, saved in the plan and read back at build time with
    #: :meth:`Plugin.decided` instead of being recomputed: an instance of the plugin's
    #: ``Decisions`` dataclass (fields of plain types: str, int, float, bool, lists, dicts), or
    #: a plain dict from a plugin without one.
    decisions: Any = field(default_factory=dict)


@dataclass(frozen=True)
class LinearLayer:
    """One ``nn.Linear`` of the built model, as the plan sees it without torch
    (:meth:`Context.linear_layers`): what a precision plugin plans to convert."""

    #: Fully qualified module name (``blocks.0.attention.w_q``).
    name: str
    #: Input features.
    in_features: int
    #: Output features.
    out_features: int
    #: True for an ``nn.Linear`` subclass (its own methods, e.g. a custom initialisation).
    subclass: bool = False
    #: Why this layer stays in high precision under any low-precision plugin (None: the
    #: precision plugin's own rule decides).
    keep: str | None = None


@dataclass(frozen=True)
class Context:
    """What a plugin's ``resolve`` checks against: the typed run, the world and what the
    earlier passes decided."""

    run: RunConfig
    world: World
    mesh: Mesh
    dtypes: Dtypes
    #: Model vocabulary (the tokenizer's, padded to a multiple of 128).
    vocab_size: int
    #: ``(plugin, cfg)`` of the run's layer plugins in the order they edit the model.
    layers: tuple[tuple[LayerPlugin, Any], ...] = ()
    #: The plan's execution decisions (attention rule, ``torch.compile``, metrics cadence).
    execution: Execution | None = None
    #: The ``nn.Linear`` layers of the dense model before any layer plugin edits it
    #: (:func:`olmx.plan.linears.dense_linears`).
    dense_layers: tuple[LinearLayer, ...] = ()

    def linear_layers(self) -> list[LinearLayer]:
        """The ``nn.Linear`` layers the built model will have (:attr:`dense_layers`, edited by
        every layer plugin's :meth:`LayerPlugin.linear_layers`), without torch."""
        layers = list(self.dense_layers)
        for plugin, cfg in self.layers:
            layers = plugin.linear_layers(cfg, self, layers)
        return layers

    def tokens_per_rank(self) -> tuple[int, str]:
        """Tokens one rank's linear layers see per micro-batch (the sequence split over ``cp``),
        and how they come about."""
        t, seq = self.run.trainer, self.run.data.seq_len
        how = f"trainer.micro_batch_size={t.micro_batch_size} x data.seq_len={seq}"
        if self.mesh.cp > 1:
            how += f" / context-parallel degree {self.mesh.cp}"
        return t.micro_batch_size * seq // self.mesh.cp, how

    def dtype_rows(self, compute_label: str = "compute") -> list[tuple[str, str]]:
        """Plan rows saying which tensors are kept in which dtype under this mesh (how the core
        applies :attr:`dtypes`); ``compute_label`` names what the compute rows are about."""
        d, world = self.dtypes, self.world
        rows = [("master weights, optimizer state", "float32")]
        if self.mesh.shards_params:
            return rows + [
                (f"{compute_label} (all-gathered parameters)", d.param),
                ("gradient reduction (reduce-scatter)", d.reduce),
                ("gradients the optimizer sees", "float32 (sharded)"),
                (
                    "mechanism",
                    f"OLMo-core dp_config.param_dtype={d.param}, reduce_dtype={d.reduce} "
                    "(FSDP2 mixed-precision policy)",
                ),
            ]
        if d.param == "float32":
            rows.append((compute_label, "float32 (no autocast)"))
        else:
            rows.append(
                (
                    compute_label,
                    f"{d.param} for autocast's lower-precision ops (linear, matmul, attention); "
                    "the rest as torch.autocast's op lists say",
                )
            )
        rows.append(("gradients, reduction", "float32" if world.size > 1 else "float32 (one process: no reduction)"))
        rows.append(
            (
                "mechanism",
                f"OLMo-core autocast_precision={d.param} (torch.autocast)" if d.param != "float32" else "none",
            )
        )
        return rows


class Plugin:
    """What every plugin has. Subclass the base class of your kind, not this one."""

    #: The plugin kind (set by each base class).
    kind: ClassVar[str] = ""
    #: Entry-point name = Hydra option = config key.
    name: str = ""
    #: One line for ``olmx plugins list``.
    description: str = ""
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


def check_dtypes(dtypes: Dtypes, *, mesh: Mesh, world: World, field_prefix: str) -> None:
    """The core's check of a precision plugin's :class:`Dtypes` against the mesh."""
    for key, value in (("param_dtype", dtypes.param), ("reduce_dtype", dtypes.reduce)):
        if value not in DTYPES:
            raise ConfigError(f"{field_prefix}.{key}", f"'{value}' is not one of {', '.join(DTYPES)}")
    if dtypes.reduce != "float32" and not mesh.shards_params and world.size > 1:
        raise ConfigError(
            f"{field_prefix}.reduce_dtype",
            f"{dtypes.reduce} reduction needs a data-parallel strategy that shards parameters "
            f"(parallel=[fsdp] or [hsdp]): without sharding the parameters stay float32 and their float32 "
            f"gradients are all-reduced",
        )
