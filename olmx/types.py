"""The plan's value types, a leaf: the :class:`World` the infra plugin resolves, the data-parallel
:class:`Layout`, the :class:`Mesh` and :class:`Dtypes` plugins read as capabilities, a plugin's
:class:`Contribution`, the torch-free :class:`LinearLayer` list and the :class:`Context`
``resolve`` checks against, with the vocabulary they are written in (dtypes, claimable mesh
dimensions, parallel capabilities). :mod:`olmx.api` re-exports them for plugin authors; the core
imports them from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from olmx.errors import ConfigError

if TYPE_CHECKING:
    from olmx.api import LayerPlugin
    from olmx.config.schema import RunConfig
    from olmx.plan.execution import Execution

__all__ = [
    "World",
    "Layout",
    "Mesh",
    "Dtypes",
    "Contribution",
    "LinearLayer",
    "Context",
    "check_dtypes",
    "FF_H",
    "DTYPES",
    "CLAIMABLE_DIMS",
    "PARALLEL_CAPABILITIES",
    "ADD_ON_CAPABILITIES",
    "PIPELINE_TOKEN_IDS",
]

#: h-wide tensors per token a SwiGLU feed-forward of hidden width h keeps for its backward
#: pass (the two projections' outputs, the SiLU and the product): what the memory model
#: counts, and what a layer plugin with SwiGLU experts counts in its activation estimate.
FF_H = 4

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
    """The processes a run will have, as the infra plugin's ``world(cfg)`` returns them (no
    torch, nothing started). Only ``nnodes`` and ``nproc_per_node`` are required; the plan
    chooses by the rest: ``device`` (the attention kernel, precision ``auto``, which checks
    apply), ``device_name`` and ``compute_capability`` (hardware checks such as FP8's, the peak
    FLOP/s of the throughput estimate, :mod:`olmx.hardware`), ``device_memory_gib`` (the memory
    estimate's limit) and ``warnings`` (printed with the plan). A target that plans for machines
    it cannot see (a cluster, a cloud GPU) fills them from its settings (``olmx.hardware``'s
    tables by GPU name); ``olmx.launch.devices.local_devices()`` describes this machine."""

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
    """The run's device mesh and its capabilities, validated once against the world
    (:meth:`validate`, the one place its structure is checked).

    ``dp_replicate x dp_shard x cp x tp x pp`` ranks; experts (``ep``) are split over ``ep`` of the
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

    def data_parallel_ranks(self, world: World, fields: Mapping[str, str] | None = None) -> int:
        """The ranks ``pp``, ``cp`` and ``tp`` leave for data parallelism on ``world``, each checked:
        at least 1, dividing what the dimensions before it leave (``pp``, then ``cp``, then ``tp``),
        and ``cp`` and ``tp`` not together. ``fields`` names what set each dimension in messages
        (the plugin section that claimed it; :meth:`validate`)."""
        named = fields or {}
        sizes = (("pp", self.pp), ("cp", self.cp), ("tp", self.tp))
        for dim, size in sizes:
            if size < 1:
                raise ConfigError(named.get(dim, "parallel"), f"mesh dimension '{dim}' must be at least 1, got {size}")
        left = world.size
        for dim, size in sizes:
            if left % size:
                raise ConfigError(
                    named.get(dim, "parallel"),
                    f"{dim}={size} must divide the world size {world.size} "
                    f"({world.nnodes} node(s) x {world.nproc_per_node} processes)"
                    + (f", {left} rank(s) left by the dimensions before it" if left != world.size else ""),
                )
            left //= size
        if self.cp > 1 and self.tp > 1:
            raise ConfigError(
                named.get("tp", "parallel"),
                f"tensor parallelism with context parallelism ({named.get('cp', 'parallel')}) is not supported yet",
            )
        return left

    def validate(self, world: World, fields: Mapping[str, str] | None = None) -> Mesh:
        """The mesh itself checked against ``world``, the one place its structure is checked; the
        mesh. :meth:`data_parallel_ranks`, then ``dp_replicate x dp_shard`` (each at least 1) equal
        to those ranks, and ``ep`` (at least 1) dividing them and not beside ``cp`` or ``tp``.

        ``fields`` names, for messages, what set each dimension: ``cp``, ``tp``, ``pp`` the
        plugin section that claimed it, ``dp`` the data-parallel strategy's section (``ep``:
        :attr:`ep_field`, else ``dp``'s). What a plugin needs of the mesh (a layer with experts,
        a strategy that shards parameters beside ``tp``) is the plan's to check
        (:mod:`olmx.plan.mesh`)."""
        named = fields or {}
        dp_ranks = self.data_parallel_ranks(world, named)
        strategy = named.get("dp", "parallel")
        if self.dp_replicate * self.dp_shard != dp_ranks or min(self.dp_replicate, self.dp_shard, self.ep) < 1:
            raise ConfigError(
                strategy,
                f"lays out {self.dp_replicate} x {self.dp_shard} ranks, but there are {dp_ranks} data-parallel ranks",
            )
        if self.ep > 1:
            ep_field = self.ep_field or strategy
            if dp_ranks % self.ep:
                raise ConfigError(ep_field, f"{self.ep} must divide the {dp_ranks} data-parallel ranks")
            for dim, size in (("cp", self.cp), ("tp", self.tp)):
                if size > 1:
                    raise ConfigError(
                        ep_field,
                        f"expert parallelism (ep={self.ep}) with {CLAIMABLE_DIMS[dim].split(':')[0]} "
                        f"({dim}={size}, {named.get(dim, 'parallel')}) is not supported",
                    )
        return self

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


def check_dtypes(dtypes: Dtypes, *, mesh: Mesh, world: World, plugin: str, section: str, cfg: Any) -> None:
    """The core's check of the :class:`Dtypes` that precision plugin ``plugin`` (config section
    ``section``, settings ``cfg``) chose for this mesh. A refusal names the plugin's own field
    where its config has one (``precision.param_dtype``), else the section and the plugin."""

    def refuse(key: str, value: str, why: str) -> ConfigError:
        if key in getattr(type(cfg), "__dataclass_fields__", {}):
            return ConfigError(f"{section}.{key}", f"'{value}' {why}")
        what = key.removesuffix("_dtype")
        return ConfigError(section, f"the precision plugin '{plugin}' chose {what} dtype '{value}', which {why}")

    for key, value in (("param_dtype", dtypes.param), ("reduce_dtype", dtypes.reduce)):
        if value not in DTYPES:
            raise refuse(key, value, f"is not one of {', '.join(DTYPES)}")
    if dtypes.reduce != "float32" and not mesh.shards_params and world.size > 1:
        raise refuse(
            "reduce_dtype",
            dtypes.reduce,
            "as the reduction dtype needs a data-parallel strategy that shards parameters "
            "(parallel=[fsdp] or [hsdp]): without sharding the parameters stay float32 and their float32 "
            "gradients are all-reduced",
        )
