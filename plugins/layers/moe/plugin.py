"""Mixture of experts: turns the FFNs of chosen blocks into routed (and shared) experts.

The portable path (olmx's own MoE, :mod:`.block`) runs on CPU and GPU and is the tested
reference. Expert parallelism comes from the ``ddp_ep`` strategy or ``hsdp`` with
``parallel.hsdp.expert_parallel=true``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from olmx.errors import ConfigError
from olmx.protocols import Contribution, World

GATINGS = ("softmax", "sigmoid")
BACKENDS = ("auto", "portable", "olmo_core")


@dataclass
class MoEConfig:
    """Settings of ``layers=[moe]``."""

    #: Routed experts per MoE block.
    num_experts: int = 8
    #: Experts each token is routed to.
    top_k: int = 2
    #: Hidden width of each routed expert's SwiGLU; null means the model's FFN width.
    hidden_size: Optional[int] = None
    #: Router scores: ``softmax`` over experts or ``sigmoid`` per expert.
    gating: str = "softmax"
    #: Divide the top-k combine weights by their p-norm (1.0 makes them sum to one); null: off.
    normalize_expert_weights: Optional[float] = None
    #: Aux-loss-free balancing: per-step expert-bias change (DeepSeek-V3: 0.001); null: off.
    bias_gamma: Optional[float] = None
    #: Hidden width of an always-on shared expert; null: none.
    shared_hidden_size: Optional[int] = None
    #: null: dropless. Otherwise each expert takes at most ceil(cf * top_k * tokens / experts)
    #: tokens per forward; the rest are dropped (and counted).
    capacity_factor: Optional[float] = None
    #: Weight of the load-balancing loss (null disables).
    lb_loss_weight: Optional[float] = 0.01
    #: Weight of the router z-loss (null disables).
    z_loss_weight: Optional[float] = None
    #: Make every k-th block an MoE block (blocks k-1, 2k-1, ...); 1 = all blocks.
    every: int = 1
    #: Explicit block indices to turn into MoE blocks (overrides ``every``).
    blocks: Optional[list[int]] = None
    #: ``portable`` (olmx's MoE, runs everywhere), ``olmo_core`` (OLMo-core's fused CUDA MoE;
    #: not wired yet) or ``auto`` (portable until the OLMo-core path lands).
    backend: str = "auto"


def moe_blocks(cfg: MoEConfig, n_layers: int) -> list[int]:
    """Indices of the blocks that become MoE blocks."""
    if cfg.blocks is not None:
        return sorted(set(cfg.blocks))
    return [i for i in range(n_layers) if (i + 1) % cfg.every == 0]


def expert_hidden(cfg: MoEConfig, model: Any) -> int:
    """Hidden width of one routed expert."""
    return cfg.hidden_size if cfg.hidden_size is not None else model.hidden_size


class MoELayer:
    """Places portable MoE blocks with OLMo-core's named blocks / block overrides."""

    name = "moe"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = MoEConfig

    def resolve(self, cfg: MoEConfig, run: Any, world: World) -> Contribution:
        """Check the settings; count total and active parameters of the MoE blocks."""
        m = run.model
        if cfg.num_experts < 1:
            raise ConfigError("layers.moe.num_experts", f"must be at least 1, got {cfg.num_experts}")
        if not 1 <= cfg.top_k <= cfg.num_experts:
            raise ConfigError("layers.moe.top_k", f"{cfg.top_k} must be between 1 and layers.moe.num_experts={cfg.num_experts}")
        if cfg.gating not in GATINGS:
            raise ConfigError("layers.moe.gating", f"'{cfg.gating}' is not one of {', '.join(GATINGS)}")
        if cfg.backend not in BACKENDS:
            raise ConfigError("layers.moe.backend", f"'{cfg.backend}' is not one of {', '.join(BACKENDS)}")
        if cfg.backend == "olmo_core":
            raise ConfigError("layers.moe.backend", "the OLMo-core (CUDA) MoE path is not wired in this version; "
                              "use portable or auto")
        if cfg.capacity_factor is not None and cfg.capacity_factor <= 0:
            raise ConfigError("layers.moe.capacity_factor", f"must be positive, got {cfg.capacity_factor}")
        if cfg.every < 1:
            raise ConfigError("layers.moe.every", f"must be at least 1, got {cfg.every}")
        blocks = moe_blocks(cfg, m.n_layers)
        bad = [b for b in blocks if not 0 <= b < m.n_layers]
        if bad:
            raise ConfigError("layers.moe.blocks", f"{bad} outside [0, model.n_layers={m.n_layers})")
        if not blocks:
            raise ConfigError("layers.moe.every", f"{cfg.every} selects no block of model.n_layers={m.n_layers}")
        d, h = m.d_model, expert_hidden(cfg, m)
        per_block = cfg.num_experts * d + 3 * cfg.num_experts * d * h + 3 * d * (cfg.shared_hidden_size or 0)
        active = per_block - 3 * (cfg.num_experts - cfg.top_k) * d * h
        dense = 3 * d * m.hidden_size
        dispatch = "dropless" if cfg.capacity_factor is None else f"capacity factor {cfg.capacity_factor}"
        rows = [("MoE blocks", f"{blocks} of {m.n_layers}"),
                ("experts", f"{cfg.num_experts} x SwiGLU({d}->{h}), top-{cfg.top_k} {cfg.gating}, {dispatch}"),
                ("parameters per MoE block", f"{per_block:,} total, {active:,} active")]
        if cfg.shared_hidden_size:
            rows.append(("shared expert", f"SwiGLU({d}->{cfg.shared_hidden_size})"))
        return Contribution(rows=rows, params=len(blocks) * (per_block - dense),
                            active_params=len(blocks) * (active - dense))

    def moe_config(self, cfg: MoEConfig, plan: Any) -> Any:
        """The portable MoE's OLMo-core-style config."""
        from olmx_plugins.layers.moe.block import MoEFeedForwardConfig

        model = plan.config["model"]
        return MoEFeedForwardConfig(
            num_experts=cfg.num_experts, top_k=cfg.top_k,
            hidden_size=cfg.hidden_size if cfg.hidden_size is not None else model["hidden_size"],
            gating=cfg.gating, normalize_expert_weights=cfg.normalize_expert_weights, bias_gamma=cfg.bias_gamma,
            shared_hidden_size=cfg.shared_hidden_size, capacity_factor=cfg.capacity_factor,
            lb_loss_weight=cfg.lb_loss_weight, z_loss_weight=cfg.z_loss_weight,
            init_std=model["init_std"], init_seed=plan.config["trainer"]["seed"],
        )

    def apply_model_config(self, cfg: MoEConfig, model_config: Any, plan: Any) -> Any:
        """Named blocks + pattern for ``every`` (dotted overrides reach them), block overrides
        for an explicit list."""
        from olmx_plugins.layers.moe.block import MoEBlockConfig

        if isinstance(model_config.block, dict):
            raise ConfigError("layers.moe", "another layer plugin already replaced the blocks; "
                              "combining it with moe is not supported yet")
        dense = model_config.block
        moe = MoEBlockConfig.from_dense(dense, moe=self.moe_config(cfg, plan))
        if cfg.blocks is not None:
            overrides = dict(model_config.block_overrides or {})
            overrides.update({i: moe for i in moe_blocks(cfg, model_config.n_layers)})
            return replace(model_config, block_overrides=overrides)
        return replace(model_config, block={"dense": dense, "moe": moe},
                       block_pattern=["dense"] * (cfg.every - 1) + ["moe"])

    def apply_model(self, cfg: MoEConfig, model: Any, plan: Any) -> None:
        """Nothing: expert parallelism is applied by the parallel strategy."""

    def callbacks(self, cfg: MoEConfig, plan: Any) -> dict[str, Any]:
        """Expert-bias balancing after every step (when ``bias_gamma`` is set)."""
        if cfg.bias_gamma is None:
            return {}
        from olmx_plugins.layers.moe.callbacks import ExpertBiasCallback

        return {"moe_expert_bias": ExpertBiasCallback()}


MOE = MoELayer()
