"""Engram inside OLMo-core 3.0: a block config, the block classes, and the model seam.

How the hash ids reach the blocks. OLMo-core's ``Transformer.forward`` passes every block
``**all_block_kwargs, **per_block_kwargs[block_idx]``, both built by
``Transformer._prepare_inputs``; keyword arguments that the model itself does not know are
dropped there, and the blocks never see ``input_ids``. :func:`apply_engram_inputs` therefore
switches the built model to a subclass (:class:`EngramTransformer`, like FSDP2 switches a
module's class) whose ``_prepare_inputs`` compresses and hashes ``input_ids`` once per
(micro-)batch for all Engram layers and adds ``per_block_kwargs[l]["engram_hash_ids"]`` (a
``LongTensor[B, T, (N-1)*K]``) for each Engram layer ``l``. No global state: activation
checkpointing and recomputation receive the same ids as the forward.

An Engram block (:class:`EngramBlockConfig`) is any OLMo-core dense or MoE block, or any
other block config given as its ``base`` (e.g. olmx's portable MoE block), plus an
:class:`~.module.Engram` at ``block.engram``, run on the block input and added to the
residual before attention: ``x = x + engram(x, engram_hash_ids)``, then the base block.

Parallelism: sharded tables (``1d``/``2d``) are excluded from FSDP (the block passes them as
``ignored_params``) and DDP (``EngramTransformer.apply_ddp`` passes them as ``ignored_modules``
through :func:`.ddp.apply_ddp_ignoring`). Tensor parallelism is refused. On a pipeline stage
the model hashes the token ids olmx's pipeline train module passes every stage
(:data:`olmx.api.PIPELINE_TOKEN_IDS`; ``input_ids`` are hidden states there) for the Engram
blocks the stage holds, whose tables are replicated (the plan refuses sharded ones). Under Ulysses context
parallelism the hash ids are computed on the whole sequence and then sharded like the input
ids, and the convolution reads the previous shard's last ``(kernel_size - 1) * N`` positions
(``olmx.worker.halo``), so a sharded model computes what the unsharded one does; ring attention
is refused.

Configs: :class:`EngramConfig` is derived from the user's ``layers.engram``
(:class:`~.config.EngramLayerConfig`), which the plugin validates at plan time. What the block
side still checks is how blocks were placed (a block index outside ``layer_ids``, a hasher that
disagrees with the model), which only a config written by hand can get wrong.

Optimizer: the tables match :data:`TABLE_PARAM_PATTERN` (``*.engram.table.weight``); put them
in their own group (the paper: Adam, 5x learning rate, no weight decay). Engram's parameters
that are not matrices (convolution kernel, norm gains, projection biases) match
:data:`NON_MATRIX_PARAM_PATTERNS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
from olmo_core.config import Config
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.transformer.block import (
    LayerNormScaledTransformerBlock,
    MoEReorderedNormTransformerBlock,
    MoETransformerBlock,
    PeriNormTransformerBlock,
    ReorderedNormTransformerBlock,
    TransformerBlock,
    TransformerBlockBase,
)
from olmo_core.nn.transformer.config import (
    TransformerBlockConfig,
    TransformerDataParallelWrappingStrategy,
)
from olmo_core.nn.transformer.model import MoETransformer, Transformer
from torch.distributed import DeviceMesh
from torch.distributed.tensor import Placement

from olmx.api import PIPELINE_TOKEN_IDS

from .compression import TokenizerCompression
from .config import EngramLayerConfig as _User  # the user's config: the derived fields' defaults
from .ddp import apply_ddp_ignoring
from .hashing import NgramHasher, ngram_table_sizes
from .module import Engram
from .sharding import EngramTable, TableSharding

__all__ = [
    "ENGRAM_HASH_IDS_KWARG",
    "NON_MATRIX_PARAM_PATTERNS",
    "TABLE_PARAM_PATTERN",
    "EngramBlockConfig",
    "EngramConfig",
    "EngramInputs",
    "EngramMoETransformer",
    "EngramTransformer",
    "apply_engram_inputs",
    "engram_block_class",
]

ENGRAM_HASH_IDS_KWARG = "engram_hash_ids"
"""Name of the per-block keyword argument that carries a layer's hash ids."""

TABLE_PARAM_PATTERN = "*.engram.table.weight"
"""fnmatch pattern (as in OLMo-core's ``OptimGroupOverride``) of every Engram table parameter."""

NON_MATRIX_PARAM_PATTERNS = [
    "*.engram.conv_weight",
    "*.engram.key_norm.weight",
    "*.engram.query_norm.weight",
    "*.engram.conv_norm.weight",
    "*.engram.key_proj.bias",
    "*.engram.value_proj.bias",
]
"""fnmatch patterns of Engram's parameters that are neither tables nor matrices."""

_LAYER_SEED_STRIDE = 10007
_Wrapping = TransformerDataParallelWrappingStrategy


@dataclass
class EngramConfig(Config):
    """The Engram hyperparameters shared by a model's Engram blocks, as OLMo-core builds them.

    Derived, not written by users: ``EngramLayer.engram_config`` fills it from ``layers.engram``
    (:class:`~.config.EngramLayerConfig`, validated by the plugin's ``resolve``) and the plan; a
    field named after a ``layers.engram`` field has that field's meaning and default. Nothing
    here is validated again.
    """

    layer_ids: list[int]
    """``layers.engram.layer_ids`` resolved against the model: 0-based blocks carrying Engram."""
    vocab_size_per_ngram: list[int]
    """``layers.engram.vocab_size_per_ngram`` resolved against the vocabulary: configured rows of
    each head's table, per order (N - 1 entries; the real sizes are the next unused primes)."""
    max_ngram_size: int = _User.max_ngram_size
    """``layers.engram.max_ngram_size``: ``N``, n-gram orders 2..N and the convolution's dilation."""
    n_head_per_ngram: int = _User.n_head_per_ngram
    """``layers.engram.n_head_per_ngram``: ``K`` hash heads (tables) per order."""
    n_embed_per_ngram: int = _User.n_embed_per_ngram
    """``layers.engram.n_embed_per_ngram``: width of one order's concatenated heads."""
    kernel_size: int = _User.kernel_size
    """``layers.engram.kernel_size``: kernel of the causal depthwise convolution."""
    seed: int = _User.seed
    """``layers.engram.seed``: seed of the hash multipliers (and, offset per layer, of the
    table initialisation)."""
    zero_init_conv: bool = _User.zero_init_conv
    """``layers.engram.zero_init_conv``: start the convolution at zero."""
    gate_norm_eps: float | None = None
    """Epsilon of the gate's key and query RMSNorms; None: the float32 epsilon, as the demo's
    ``nn.RMSNorm()`` (not a user setting)."""
    conv_norm_eps: float = 1e-5
    """Epsilon of the convolution's RMSNorm, the demo's (not a user setting)."""
    table_init_std: float = 0.02
    """``layers.engram.table_init_std`` resolved against the model (null there: ``model.init_std``;
    0.02 here, OLMo-core's default ``init_std``): std of the table initialisation, which also
    scales the projection biases' initialisation."""
    sharding: TableSharding = TableSharding.replicated
    """``layers.engram.sharding`` as the plan decided it (``auto`` resolved): ``replicated``,
    ``1d`` or ``2d``."""
    shard_degree: int | None = _User.shard_degree
    """``layers.engram.shard_degree``: ranks per shard group, for ``sharding=2d``."""

    def __post_init__(self):
        # A conversion, not a check: configs from YAML or ``Config.from_dict`` carry strings.
        self.sharding = TableSharding(self.sharding)

    def table_sizes(self, layer_id: int) -> list[int]:
        """Prime table sizes of ``layer_id`` (the same as ``NgramHasher.table_sizes``)."""
        sizes = ngram_table_sizes(
            layer_ids=self.layer_ids,
            max_ngram_size=self.max_ngram_size,
            n_head_per_ngram=self.n_head_per_ngram,
            vocab_size_per_ngram=self.vocab_size_per_ngram,
        )
        if layer_id not in sizes:  # a block config placed by hand: the plugin places them by layer_ids
            raise OLMoConfigurationError(
                f"block {layer_id} is an Engram block but not in engram.layer_ids={self.layer_ids}"
            )
        return sizes[layer_id]

    def build_hasher(self, *, pad_id: int, compressed_vocab_size: int) -> NgramHasher:
        """The hasher; ``pad_id`` is canonical (``compression.canonical(raw_pad_id)``)."""
        return NgramHasher(
            layer_ids=self.layer_ids,
            max_ngram_size=self.max_ngram_size,
            n_head_per_ngram=self.n_head_per_ngram,
            vocab_size_per_ngram=self.vocab_size_per_ngram,
            pad_id=pad_id,
            seed=self.seed,
            compressed_vocab_size=compressed_vocab_size,
        )

    def build(self, *, d_model: int, layer_id: int, init_device: str = "cpu") -> Engram:
        """The Engram module of block ``layer_id``."""
        return Engram(
            d_model=d_model,
            table_sizes=self.table_sizes(layer_id),
            max_ngram_size=self.max_ngram_size,
            n_head_per_ngram=self.n_head_per_ngram,
            n_embed_per_ngram=self.n_embed_per_ngram,
            kernel_size=self.kernel_size,
            zero_init_conv=self.zero_init_conv,
            gate_norm_eps=self.gate_norm_eps,
            conv_norm_eps=self.conv_norm_eps,
            table_init_std=self.table_init_std,
            table_init_seed=self.seed + _LAYER_SEED_STRIDE * layer_id,
            sharding=self.sharding,
            shard_degree=self.shard_degree,
            init_device=init_device,
        )

    def num_table_params(self, layer_id: int) -> int:
        """Table parameters of one layer (rows x row width)."""
        return sum(self.table_sizes(layer_id)) * (self.n_embed_per_ngram // self.n_head_per_ngram)

    def num_dense_params(self, d_model: int) -> int:
        """Non-table parameters of one Engram module."""
        d_mem = (self.max_ngram_size - 1) * self.n_embed_per_ngram
        return 2 * (d_mem * d_model + d_model) + 3 * d_model + self.kernel_size * d_model


@dataclass
class EngramBlockConfig(TransformerBlockConfig):
    """An OLMo-core block (any dense or MoE ``name``) with Engram before its attention.

    Place it with named blocks and ``block_pattern`` (or ``block_overrides``); the index of
    every block built from it must be in ``engram.layer_ids``.
    """

    engram: EngramConfig | None = None
    """The Engram hyperparameters (required)."""
    base: TransformerBlockConfig | None = None
    """The block Engram extends, of any block config class (e.g. olmx's portable MoE block);
    None: the OLMo-core block described by this config's own inherited fields."""

    @classmethod
    def extending(cls, base: TransformerBlockConfig, *, engram: EngramConfig) -> "EngramBlockConfig":
        """``base`` with Engram before its attention. A plain OLMo-core block is copied into
        this config's own fields (dotted overrides reach them); another class is kept as
        ``base`` and built as it is."""
        inherited = {f.name: getattr(base, f.name) for f in fields(TransformerBlockConfig)}
        keep = type(base) is not TransformerBlockConfig
        return cls(**inherited, engram=engram, base=base if keep else None)

    def _engram(self) -> EngramConfig:
        if self.engram is None:
            raise OLMoConfigurationError("EngramBlockConfig.engram must be set")
        return self.engram

    def _base_config(self) -> TransformerBlockConfig:
        if self.base is not None:
            return self.base
        return TransformerBlockConfig(**{f.name: getattr(self, f.name) for f in fields(TransformerBlockConfig)})

    def build(
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: BufferCache | None = None,
    ) -> TransformerBlockBase:
        """Build the base block, switch it to its Engram class and attach ``block.engram``."""
        engram = self._engram()
        block = self._base_config().build(
            d_model=d_model,
            block_idx=block_idx,
            n_layers=n_layers,
            init_device=init_device,
            cache=cache,
        )
        block.__class__ = engram_block_class(type(block))
        block.engram = engram.build(d_model=d_model, layer_id=block_idx, init_device=init_device)
        return block

    def num_params(self, d_model: int) -> int:
        """Base block plus Engram. Per-layer primes differ by a few rows; this uses their mean
        over ``engram.layer_ids`` (``Transformer.num_params`` of a built model is exact)."""
        engram = self._engram()
        tables = [engram.num_table_params(layer) for layer in engram.layer_ids]
        return (
            self._base_config().num_params(d_model)
            + engram.num_dense_params(d_model)
            + round(sum(tables) / len(tables))
        )

    def num_active_params(self, d_model: int) -> int:
        """Base block's active parameters plus Engram's dense ones (tables count as sparse)."""
        engram = self._engram()
        return self._base_config().num_active_params(d_model) + engram.num_dense_params(d_model)


class EngramBlockMixin:
    """Adds ``self.engram`` before the base block's forward; see the module docstring."""

    engram: Engram

    def forward(
        self,
        x: torch.Tensor,
        *,
        engram_hash_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``base_block(x + engram(x, engram_hash_ids), **kwargs)``."""
        if engram_hash_ids is None:
            raise RuntimeError(
                f"Engram block {getattr(self, 'block_idx', '?')} got no '{ENGRAM_HASH_IDS_KWARG}'; "
                "prepare the model with apply_engram_inputs(model, ...)"
            )
        x = x + self.engram(x, engram_hash_ids)
        return super().forward(x, **kwargs)  # type: ignore[misc]

    def apply_fsdp(
        self,
        dp_mesh: DeviceMesh | None = None,
        prefetch_factor: int = 0,
        wrapping_strategy: Any = _Wrapping.full,
        **fsdp_kwargs: Any,
    ) -> None:
        """The base block's FSDP wrapping, with a sharded table left out (``ignored_params``)."""
        if self.engram.table.is_sharded:
            ignored = set(fsdp_kwargs.get("ignored_params") or ())
            fsdp_kwargs["ignored_params"] = ignored | {self.engram.table.weight}
        super().apply_fsdp(  # type: ignore[misc]
            dp_mesh=dp_mesh,
            prefetch_factor=prefetch_factor,
            wrapping_strategy=wrapping_strategy,
            **fsdp_kwargs,
        )

    def apply_tp(self, tp_mesh: DeviceMesh, *, input_layout: Placement, float8_enabled: bool = False) -> None:
        """Refused: Engram is not tensor-parallel."""
        raise NotImplementedError("Engram blocks do not support tensor parallelism")

    def apply_cp(self, cp_mesh: DeviceMesh, ring: Any = None, uly: Any = None) -> None:
        """Ulysses context parallelism: the Engram convolution reads the previous sequence
        shard's last positions (a halo exchange over the group); ring attention is refused."""
        if ring is not None or uly is None:
            raise NotImplementedError("Engram blocks support only Ulysses context parallelism")
        self.engram.cp_group = cp_mesh.get_group()
        super().apply_cp(cp_mesh, ring=ring, uly=uly)  # type: ignore[misc]

    def num_flops_per_token(self, seq_len: int) -> int:
        """Base block plus Engram FLOPs."""
        base = super().num_flops_per_token(seq_len)  # type: ignore[misc]
        return base + self.engram.num_flops_per_token()


class EngramTransformerBlock(EngramBlockMixin, TransformerBlock):
    """``TransformerBlock`` (``name=default``) with Engram."""


class EngramReorderedNormTransformerBlock(EngramBlockMixin, ReorderedNormTransformerBlock):
    """``ReorderedNormTransformerBlock`` (OLMo 2/3, ``name=reordered_norm``) with Engram."""


class EngramPeriNormTransformerBlock(EngramBlockMixin, PeriNormTransformerBlock):
    """``PeriNormTransformerBlock`` (``name=peri_norm``) with Engram."""


class EngramLayerNormScaledTransformerBlock(EngramBlockMixin, LayerNormScaledTransformerBlock):
    """``LayerNormScaledTransformerBlock`` (``name=default_scaled``) with Engram."""


class EngramMoETransformerBlock(EngramBlockMixin, MoETransformerBlock):
    """``MoETransformerBlock`` (``name=moe``) with Engram."""


class EngramMoEReorderedNormTransformerBlock(EngramBlockMixin, MoEReorderedNormTransformerBlock):
    """``MoEReorderedNormTransformerBlock`` (``name=moe_reordered_norm``) with Engram."""


_ENGRAM_BLOCK_CLASSES: dict[type, type] = {
    TransformerBlock: EngramTransformerBlock,
    ReorderedNormTransformerBlock: EngramReorderedNormTransformerBlock,
    PeriNormTransformerBlock: EngramPeriNormTransformerBlock,
    LayerNormScaledTransformerBlock: EngramLayerNormScaledTransformerBlock,
    MoETransformerBlock: EngramMoETransformerBlock,
    MoEReorderedNormTransformerBlock: EngramMoEReorderedNormTransformerBlock,
}


def engram_block_class(block_cls: type) -> type:
    """The Engram subclass of a block class (``EngramBlockMixin`` first), made once per class.

    OLMo-core's blocks have named ones above; any other ``TransformerBlockBase`` subclass (a
    plugin's block, e.g. the portable MoE block) gets ``Engram<Name>``, as FSDP2 derives its
    ``FSDP<Name>`` classes. Its ``forward`` must take ``(x, **kwargs)``.
    """
    if block_cls in _ENGRAM_BLOCK_CLASSES.values():
        return block_cls
    if block_cls not in _ENGRAM_BLOCK_CLASSES:
        if not issubclass(block_cls, TransformerBlockBase):
            raise OLMoConfigurationError(f"Engram needs a transformer block, got {block_cls.__name__}")
        _ENGRAM_BLOCK_CLASSES[block_cls] = type(
            f"Engram{block_cls.__name__}",
            (EngramBlockMixin, block_cls),
            {"__doc__": f"``{block_cls.__name__}`` with Engram.", "__module__": __name__},
        )
    return _ENGRAM_BLOCK_CLASSES[block_cls]


class EngramInputs:
    """Raw token ids -> hash ids of the model's Engram layers (compression, then hashing)."""

    def __init__(
        self, *, compression: TokenizerCompression, hasher: NgramHasher, layer_ids: Sequence[int] | None = None
    ):
        if hasher.compressed_vocab_size != compression.compressed_vocab_size:
            raise ValueError(
                f"hasher.compressed_vocab_size={hasher.compressed_vocab_size} != "
                f"compression.compressed_vocab_size={compression.compressed_vocab_size}"
            )
        self.compression = compression
        self.hasher = hasher
        #: The Engram layers hashed: all of the hasher's, or those a pipeline stage holds.
        self.layer_ids = list(hasher.layer_ids if layer_ids is None else layer_ids)

    def __call__(self, input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
        """``{layer_id: LongTensor[B, T, (N-1)*K]}`` for raw ids ``[B, T]``."""
        if not self.layer_ids:  # a pipeline stage without Engram blocks
            return {}
        return self.hasher.hash_all(self.compression.compress(input_ids), self.layer_ids)


class EngramModelMixin:
    """Model side of Engram: hash ids into the block kwargs, sharded tables out of DDP."""

    engram_inputs: EngramInputs

    def _prepare_inputs(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any):
        # On a pipeline stage ``input_ids`` may be the previous stage's hidden states; the
        # tokens come separately (olmx's pipeline train module passes them to every stage).
        tokens = kwargs.pop(PIPELINE_TOKEN_IDS, None)
        if tokens is None:
            if getattr(self, "_pp_enabled", False):
                raise RuntimeError(f"Engram on a pipeline stage needs the token ids as {PIPELINE_TOKEN_IDS}=")
            tokens = input_ids
        # Hash the whole sequence before context parallelism shards it: the first tokens of
        # a shard need the previous shard's last N-1 tokens.
        hashes = self.engram_inputs(tokens)
        input_ids, labels, all_block_kwargs, per_block_kwargs, lm_head_kwargs = super()._prepare_inputs(  # type: ignore[misc]
            input_ids, labels, **kwargs
        )
        balancer = getattr(self, "_cp_load_balancer", None)
        for layer_id, hash_ids in hashes.items():
            if balancer is not None:
                (hash_ids,) = balancer.batch_shard(inputs=[hash_ids], seq_dims=[1], pad_values=[0])
            per_block_kwargs[layer_id][ENGRAM_HASH_IDS_KWARG] = hash_ids.to(input_ids.device)
        return input_ids, labels, all_block_kwargs, per_block_kwargs, lm_head_kwargs

    def apply_ddp(
        self,
        dp_mesh: DeviceMesh | None = None,
        param_dtype: torch.dtype | None = None,
        compile_enabled: bool = False,
        autograd_compile_enabled: bool = False,
    ) -> None:
        """OLMo-core's ``apply_ddp``; with sharded Engram tables, its body with the tables as
        ignored modules (:mod:`.ddp` says why OLMo-core's own cannot do it)."""
        modules = self.modules()  # type: ignore[attr-defined]
        ignored = [m for m in modules if isinstance(m, EngramTable) and m.is_sharded]
        if not ignored:
            super().apply_ddp(  # type: ignore[misc]
                dp_mesh=dp_mesh,
                param_dtype=param_dtype,
                compile_enabled=compile_enabled,
                autograd_compile_enabled=autograd_compile_enabled,
            )
            return
        apply_ddp_ignoring(
            cast(Transformer, self),
            ignored_modules=ignored,
            dp_mesh=dp_mesh,
            param_dtype=param_dtype,
            compile_enabled=compile_enabled,
            autograd_compile_enabled=autograd_compile_enabled,
        )


class EngramTransformer(EngramModelMixin, Transformer):
    """``Transformer`` that feeds Engram blocks their hash ids."""


class EngramMoETransformer(EngramModelMixin, MoETransformer):
    """``MoETransformer`` that feeds Engram blocks their hash ids."""


_ENGRAM_MODEL_CLASSES: dict[type, type] = {
    Transformer: EngramTransformer,
    MoETransformer: EngramMoETransformer,
}


def apply_engram_inputs(model: Transformer, *, compression: TokenizerCompression, hasher: NgramHasher) -> Transformer:
    """Make ``model`` hash its input ids once per batch and pass them to its Engram blocks.

    Switches the model to :class:`EngramTransformer` (or :class:`EngramMoETransformer`) and
    checks that every Engram block's layer and table sizes agree with ``hasher``. Call it on
    the built model before activation checkpointing, compile and DDP/FSDP (those wrap or
    switch the class too). Returns ``model``.
    """
    cls = type(model)
    if cls not in _ENGRAM_MODEL_CLASSES.values():
        engram_cls = _ENGRAM_MODEL_CLASSES.get(cls)
        if engram_cls is None:
            raise OLMoConfigurationError(
                f"Engram needs a Transformer or MoETransformer, got {cls.__name__} "
                "(call apply_engram_inputs before parallelism wraps the model)"
            )
        model.__class__ = engram_cls
    engram_layers = []
    for key, block in model.blocks.items():
        engram = getattr(block, "engram", None)
        if not isinstance(engram, Engram):
            continue
        layer_id = int(key)
        engram_layers.append(layer_id)
        if layer_id not in hasher.layer_ids:
            raise OLMoConfigurationError(
                f"block {layer_id} has Engram but the hasher's layer_ids are {hasher.layer_ids}"
            )
        if engram.table.table_sizes != hasher.table_sizes(layer_id):
            raise OLMoConfigurationError(f"block {layer_id}: Engram table sizes differ from the hasher's")
    here = sorted(i for i in hasher.layer_ids if str(i) in model.blocks)  # a pipeline stage holds some blocks
    if sorted(engram_layers) != here:
        raise OLMoConfigurationError(
            f"Engram blocks are {sorted(engram_layers)} but the hasher's layer_ids here are {here}"
        )
    inputs = EngramInputs(compression=compression, hasher=hasher, layer_ids=here)
    model.engram_inputs = inputs
    return model
