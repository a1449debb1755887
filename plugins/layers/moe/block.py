"""OLMo-core block whose feed-forward is olmx's portable MoE.

``MoEBlockConfig`` subclasses OLMo-core's ``TransformerBlockConfig`` and overrides ``build()``
(the pattern OLMo-core uses for its own MoE-v2 block). Place it with named blocks::

    dense = TransformerConfig.llama_like(...).block
    TransformerConfig.llama_like(
        ...,
        block={"dense": dense, "moe": MoEBlockConfig.from_dense(dense, moe=MoEFeedForwardConfig(...))},
        block_pattern=["dense", "moe"],
    )

so that dotted overrides such as ``model.block.moe.moe.top_k=4`` reach it.

Rules it follows (OLMo-core research note §2.5): the block exposes ``attention`` and
``block_idx``; the MoE lives in ``self.moe`` (not ``feed_forward`` / ``feed_forward_moe``, which
``Transformer.init_weights`` would initialise as OLMo-core modules) and initialises itself in
``reset_parameters``; the config overrides ``num_params``/``num_active_params``; the block
implements ``num_flops_per_token``, ``apply_fsdp``, ``apply_cp`` and ``apply_tp`` (not
supported); ``forward`` passes ``**kwargs`` to the attention; aux losses are attached with
``olmo_core.ops.attach_auxiliary_loss``.

OLMo-core path: :meth:`MoEFeedForwardConfig.to_olmo_core_v1` and :meth:`MoEBlockConfig.to_olmo_core_v1`
give the same layer / block as OLMo-core's v1 MoE (``MoEConfig`` in a ``TransformerBlockConfig``
of type ``moe`` / ``moe_reordered_norm``, in a ``TransformerType.moe`` model), which runs its
Triton/CUDA token permutation and grouped GEMMs. Checkpoint names: the v1 block has the same
``attention.*``, ``attention_norm.*`` and ``feed_forward_norm.*`` keys; its ``feed_forward_moe.*``
keys map to ``moe.*`` and back with ``convert.convert_model_state_dict``.

The configs here are derived: users write ``layers.moe`` (:class:`~.config.MoEConfig`), which
the plugin validates at plan time and turns into :class:`MoEFeedForwardConfig`. What
``MoEBlockConfig`` still checks when it is built is its own structure (the fields a block
config written by hand may set), which no user setting reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from olmo_core.config import Config, DType
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.residual_stream import ResidualStream
from olmo_core.nn.transformer.block import TransformerBlockBase
from olmo_core.nn.transformer.config import (
    TransformerBlockConfig,
    TransformerBlockType,
    TransformerDataParallelWrappingStrategy,
)
from torch.distributed import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Placement

from .config import MoEConfig as _User  # the user's config: the derived fields' defaults
from .modules import Gating, MoEFeedForward, SharedExpertMixing

if TYPE_CHECKING:
    from olmo_core.nn.moe import MoEConfig as OLMoCoreMoEConfig

__all__ = ["MoEFeedForwardConfig", "MoEBlockConfig", "MoEBlock"]


@dataclass
class MoEFeedForwardConfig(Config):
    """The portable MoE feed-forward (:class:`~.modules.MoEFeedForward`) as OLMo-core builds it.

    Derived, not written by users: ``MoELayer.moe_config`` fills it from ``layers.moe``
    (:class:`~.config.MoEConfig`, validated by the plugin's ``resolve``) and the plan; a field
    named after a ``layers.moe`` field has that field's meaning and default. Nothing here is
    validated again.
    """

    hidden_size: int
    """Hidden width of each routed expert's SwiGLU: ``layers.moe.hidden_size`` resolved (null
    there: the model's FFN width)."""
    num_experts: int = _User.num_experts
    """``layers.moe.num_experts``: routed experts ``E``."""
    top_k: int = _User.top_k
    """``layers.moe.top_k``: routed experts per token."""
    gating: str = _User.gating
    """``layers.moe.gating``: ``softmax`` or ``sigmoid`` router scores."""
    normalize_expert_weights: float | None = _User.normalize_expert_weights
    """``layers.moe.normalize_expert_weights``: p-norm of the top-k combine weights (None: off)."""
    bias_gamma: float | None = _User.bias_gamma
    """``layers.moe.bias_gamma``: aux-loss-free balancing step (None: off). Needs
    ``update_expert_bias()`` after each batch (see ``modules.moe_layers``)."""
    shared_hidden_size: int | None = _User.shared_hidden_size
    """``layers.moe.shared_hidden_size``: width of the always-on shared expert (``n_shared *
    hidden_size`` for ``n_shared`` DeepSeek-style shared experts; None: none)."""
    shared_expert_mixing: str = "sum"
    """How the shared expert joins the routed output (not a user setting): ``sum`` (routed +
    shared, what olmx trains) or ``olmo_core_v1`` (shared/(k+1) + routed*k/(k+1), to compute
    what OLMo-core's v1 MoE does)."""
    capacity_factor: float | None = _User.capacity_factor
    """``layers.moe.capacity_factor``: None is dropless, else each expert takes at most
    ``ceil(cf * top_k * N / E)`` of a rank's ``N`` tokens per forward (earliest first)."""
    lb_loss_weight: float | None = _User.lb_loss_weight
    """``layers.moe.lb_loss_weight``: weight of the load-balancing loss (None: off)."""
    z_loss_weight: float | None = _User.z_loss_weight
    """``layers.moe.z_loss_weight``: weight of the router z-loss (None: off)."""
    scale_loss_by_num_layers: bool = True
    """Divide both loss weights by the model's number of layers, as OLMo-core does (not a user
    setting)."""
    init_std: float = 0.02
    """Std of the truncated-normal init (cut at 3 std) of router, experts and shared expert:
    the plan's ``model.init_std``."""
    init_seed: int = 0
    """Seed of the MoE init (combined with the layer index and parameter name): the plan's
    ``trainer.seed``."""
    dtype: DType = DType.float32
    """Parameter dtype (master weights stay float32; the core applies the compute dtype)."""

    def num_params(self, d_model: int) -> int:
        """Parameters of the layer: router ``E*d``, experts ``3*E*d*h``, shared ``3*d*h_s``."""
        n = self.num_experts * d_model + 3 * self.num_experts * d_model * self.hidden_size
        if self.shared_hidden_size is not None:
            n += 3 * d_model * self.shared_hidden_size
        return n

    def num_active_params(self, d_model: int) -> int:
        """Parameters used per token (``top_k`` of the routed experts)."""
        return self.num_params(d_model) - 3 * (self.num_experts - self.top_k) * d_model * self.hidden_size

    def to_olmo_core_v1(self) -> "OLMoCoreMoEConfig":
        """The same layer as OLMo-core's v1 ``MoEConfig`` (``dropless`` without a capacity
        factor, else the capacity ``default`` type). Same router (linear, softmax / sigmoid
        gating, top-k, weight normalisation, expert bias), experts, aux losses and their
        scaling; a shared expert needs ``shared_expert_mixing="olmo_core_v1"`` (v1's only
        mixing). Initialisation: v1 draws its own unless the model initialises it as the
        portable layer (:mod:`.seeded_init`, which the plugin does). Under a capacity factor the
        two paths may drop different tokens of an over-full expert."""
        from olmo_core.nn.feed_forward import FeedForwardConfig
        from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoERouterGatingFunction, MoEType

        # Not a user setting, so nothing else checks it: mapping olmx's ``sum`` mixing onto
        # v1's would silently change what the layer computes.
        if self.shared_hidden_size is not None and self.shared_expert_mixing != "olmo_core_v1":
            raise OLMoConfigurationError(
                "moe.shared_expert_mixing must be 'olmo_core_v1' to map a shared expert onto OLMo-core's v1 MoE "
                "(which mixes shared/(k+1) + routed*k/(k+1))"
            )
        return MoEConfig(
            name=MoEType.dropless if self.capacity_factor is None else MoEType.default,
            num_experts=self.num_experts,
            hidden_size=self.hidden_size,
            capacity_factor=self.capacity_factor,
            router=MoERouterConfig(
                top_k=self.top_k,
                normalize_expert_weights=self.normalize_expert_weights,
                bias_gamma=self.bias_gamma,
                gating_function=MoERouterGatingFunction(self.gating),
            ),
            shared_mlp=None
            if self.shared_hidden_size is None
            else FeedForwardConfig(hidden_size=self.shared_hidden_size, bias=False, dtype=self.dtype),
            lb_loss_weight=self.lb_loss_weight,
            z_loss_weight=self.z_loss_weight,
            scale_loss_by_num_layers=self.scale_loss_by_num_layers,
            dtype=self.dtype,
        )

    def seed_key(self, layer_idx: int) -> str:
        """The key the MoE of block ``layer_idx`` draws its weights with (``init_seed`` and the
        block; :func:`~.modules.seeded_rows`), on either backend (:mod:`.seeded_init`)."""
        return f"{self.init_seed}/blocks.{layer_idx}.moe"

    def build(self, d_model: int, *, layer_idx: int = 0, n_layers: int = 1, init_device: str = "cpu") -> MoEFeedForward:
        """Build the layer for block ``layer_idx`` of ``n_layers``."""
        scale = n_layers if self.scale_loss_by_num_layers else 1
        return MoEFeedForward(
            d_model,
            num_experts=self.num_experts,
            hidden_size=self.hidden_size,
            top_k=self.top_k,
            gating=cast(Gating, self.gating),
            normalize_expert_weights=self.normalize_expert_weights,
            bias_gamma=self.bias_gamma,
            shared_hidden_size=self.shared_hidden_size,
            shared_expert_mixing=cast(SharedExpertMixing, self.shared_expert_mixing),
            capacity_factor=self.capacity_factor,
            lb_loss_weight=None if self.lb_loss_weight is None else self.lb_loss_weight / scale,
            z_loss_weight=None if self.z_loss_weight is None else self.z_loss_weight / scale,
            init_std=self.init_std,
            seed_key=self.seed_key(layer_idx),
            dtype=self.dtype.as_pt(),
            init_device=init_device,
        )


@dataclass
class MoEBlockConfig(TransformerBlockConfig):
    """A transformer block with attention and the portable MoE as its feed-forward.

    Uses the inherited ``sequence_mixer``, ``layer_norm`` (both norms) and ``dropout``.
    ``name`` selects the norm placement: ``default`` (pre-norm, Llama) or ``reordered_norm``
    (norm on the sublayer output, OLMo-2/3). ``feed_forward`` and ``feed_forward_moe`` must be
    unset.
    """

    moe: MoEFeedForwardConfig | None = None
    """The MoE feed-forward (required)."""

    @classmethod
    def from_dense(cls, block: TransformerBlockConfig, *, moe: MoEFeedForwardConfig) -> "MoEBlockConfig":
        """The block ``block`` with its dense feed-forward replaced by ``moe``."""
        return cls(
            sequence_mixer=block.sequence_mixer,
            layer_norm=block.layer_norm,
            name=block.name,
            dropout=block.dropout,
            moe=moe,
        )

    def to_olmo_core_v1(self) -> TransformerBlockConfig:
        """The same block as OLMo-core's v1 MoE block (``moe`` for ``default``,
        ``moe_reordered_norm`` for ``reordered_norm``); the model holding it must be a
        ``TransformerType.moe`` model (``MoETransformer``)."""
        moe = self._check()
        name = (
            TransformerBlockType.moe_reordered_norm
            if self.name == TransformerBlockType.reordered_norm
            else TransformerBlockType.moe
        )
        return TransformerBlockConfig(
            sequence_mixer=self.sequence_mixer,
            layer_norm=self.layer_norm,
            name=name,
            dropout=self.dropout,
            feed_forward_moe=moe.to_olmo_core_v1(),
        )

    def _check(self) -> MoEFeedForwardConfig:
        # The block's structure only: ``moe``'s values were validated at plan time.
        if self.moe is None:
            raise OLMoConfigurationError("MoEBlockConfig.moe must be set")
        if self.feed_forward is not None or self.feed_forward_moe is not None:
            raise OLMoConfigurationError(
                "MoEBlockConfig uses 'moe'; 'feed_forward' and 'feed_forward_moe' must be unset"
            )
        if self.layer_norm is None:
            raise OLMoConfigurationError("MoEBlockConfig.layer_norm must be set")
        if self.attention_residual_alpha is not None or self.feed_forward_residual_alpha is not None:
            raise OLMoConfigurationError("MoEBlockConfig does not support residual alphas")
        if self.name not in (TransformerBlockType.default, TransformerBlockType.reordered_norm):
            raise OLMoConfigurationError(f"MoEBlockConfig.name={self.name!r} must be 'default' or 'reordered_norm'")
        return self.moe

    def build(
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: BufferCache | None = None,
    ) -> "MoEBlock":
        """Build the block (called by OLMo-core's ``Transformer`` for each layer)."""
        moe = self._check()
        return MoEBlock(
            d_model=d_model,
            block_idx=block_idx,
            n_layers=n_layers,
            config=self,
            moe=moe.build(d_model, layer_idx=block_idx, n_layers=n_layers, init_device=init_device),
            init_device=init_device,
            cache=cache,
        )

    def num_params(self, d_model: int) -> int:
        """Attention + two norms + MoE."""
        moe = self._check()
        assert self.layer_norm is not None
        return (
            self.sequence_mixer.num_params(d_model) + 2 * self.layer_norm.num_params(d_model) + moe.num_params(d_model)
        )

    def num_active_params(self, d_model: int) -> int:
        """Parameters used per token."""
        moe = self._check()
        return self.num_params(d_model) - moe.num_params(d_model) + moe.num_active_params(d_model)


class MoEBlock(TransformerBlockBase):
    """Attention + portable MoE, pre-norm (``default``) or OLMo-2 ``reordered_norm``."""

    def __init__(
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        config: MoEBlockConfig,
        moe: MoEFeedForward,
        init_device: str = "cpu",
        cache: BufferCache | None = None,
    ):
        super().__init__(n_layers=n_layers)
        assert config.layer_norm is not None
        self.d_model = d_model
        self.block_idx = block_idx
        self.reordered_norm = config.name == TransformerBlockType.reordered_norm
        self.attention = config.sequence_mixer.build(
            d_model, layer_idx=block_idx, n_layers=n_layers, init_device=init_device, cache=cache
        )
        self.attention_norm = config.layer_norm.build(d_model, init_device=init_device)
        self.moe = moe
        self.feed_forward_norm = config.layer_norm.build(d_model, init_device=init_device)
        # OLMo-core's residual streams, as its own blocks have them: a layer that edits a block's
        # residual branches (``attention_residual_stream``, ``feed_forward_residual_stream``)
        # finds them in an MoE block too. Parameter-free: the state dict is unchanged.
        self.attention_residual_stream = ResidualStream(dropout=config.dropout or 0.0)
        self.feed_forward_residual_stream = ResidualStream(dropout=config.dropout or 0.0)

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss_div_factor: torch.Tensor | float | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Apply the block to ``x`` (``[batch, seq, d_model]``); ``kwargs`` go to the attention."""
        attn, ff = self.attention_residual_stream, self.feed_forward_residual_stream
        if self.reordered_norm:
            h = attn(x, self.attention_norm(self.attention(x, **kwargs)))
            return ff(h, self.feed_forward_norm(self.moe(h, loss_div_factor=loss_div_factor)))
        h = attn(x, self.attention(self.attention_norm(x), **kwargs))
        return ff(h, self.moe(self.feed_forward_norm(h), loss_div_factor=loss_div_factor))

    def apply_tp(self, tp_mesh: DeviceMesh, *, input_layout: Placement, float8_enabled: bool = False):
        """Not supported: the portable MoE block has no tensor-parallel plan."""
        raise NotImplementedError("tensor parallelism is not supported by the portable MoE block")

    def apply_cp(self, cp_mesh: DeviceMesh, ring=None, uly=None):
        """Context parallelism: the attention's; the MoE is token-wise and only rescales its aux
        losses' ``loss_div_factor`` by the CP degree (as OLMo-core's MoE does)."""
        self.attention.apply_cp(cp_mesh, ring=ring, uly=uly)
        self.moe.cp_degree = cp_mesh.size()

    def apply_fsdp(
        self,
        dp_mesh: DeviceMesh | None = None,
        prefetch_factor: int = 0,
        wrapping_strategy: TransformerDataParallelWrappingStrategy = TransformerDataParallelWrappingStrategy.full,
        **fsdp_kwargs,
    ):
        """FSDP-wrap the block (and with ``fine_grained`` its attention and MoE separately).

        Experts sharded by ``apply_expert_parallel`` are already FSDP modules over the replica
        mesh, so this wrapping leaves them out.
        """
        if wrapping_strategy == TransformerDataParallelWrappingStrategy.fine_grained:
            att = cast(FSDPModule, fully_shard(self.attention, mesh=dp_mesh, **fsdp_kwargs))
            moe = cast(FSDPModule, fully_shard(self.moe, mesh=dp_mesh, **fsdp_kwargs))
            root = cast(FSDPModule, fully_shard(self, mesh=dp_mesh, **fsdp_kwargs))
            if prefetch_factor > 0:
                root.set_modules_to_forward_prefetch([att])
                att.set_modules_to_forward_prefetch([moe])
        else:
            fully_shard(self, mesh=dp_mesh, **fsdp_kwargs)

    def num_flops_per_token(self, seq_len: int) -> int:
        """Attention flops plus the MoE's (router, ``top_k`` experts, shared expert)."""
        return self.attention.num_flops_per_token(seq_len) + self.moe.num_flops_per_token()
