"""``layers=[moe]``: the one config of the MoE plugin, and what is derived from it.

:class:`MoEConfig` is what users write (Hydra schema, ``olmx plugins show moe``). The plugin's
fields declare their own rules (``olmx.api.setting``, checked before ``resolve``), and
``resolve`` checks what joins them (``olmx.errors.ConfigError`` at plan time);
the OLMo-core-side :class:`~.block.MoEFeedForwardConfig` is built from the validated config
(``MoELayer.moe_config``), takes its defaults from this class and checks nothing again.
Torch-free: the plan imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Optional

from olmx.api import setting


class Gating(StrEnum):
    """Values of ``gating``."""

    softmax = "softmax"
    sigmoid = "sigmoid"


class Backend(StrEnum):
    """Values of ``backend``."""

    auto = "auto"
    portable = "portable"
    olmo_core = "olmo_core"


@dataclass(frozen=True)
class MoEConfig:
    """Settings of ``layers=[moe]``."""

    #: Routed experts per MoE block.
    num_experts: int = setting(8, ge=1)
    #: Experts each token is routed to.
    top_k: int = setting(2, ge=1)
    #: Hidden width of each routed expert's SwiGLU; null means the model's FFN width.
    hidden_size: Optional[int] = setting(None, ge=1, integer=True)
    #: Router scores: ``softmax`` over experts or ``sigmoid`` per expert.
    gating: Gating = setting(Gating.softmax)
    #: Divide the top-k combine weights by their p-norm (1.0 makes them sum to one); null: off.
    normalize_expert_weights: Optional[float] = setting(None, gt=0)
    #: Aux-loss-free balancing: per-step expert-bias change (DeepSeek-V3: 0.001); null: off.
    bias_gamma: Optional[float] = setting(None, gt=0)
    #: Hidden width of an always-on shared expert; null: none.
    shared_hidden_size: Optional[int] = setting(None, ge=1, integer=True)
    #: null: dropless. Otherwise each expert takes at most ceil(cf * top_k * tokens / experts)
    #: tokens per forward; the rest are dropped (and counted).
    capacity_factor: Optional[float] = setting(None, gt=0)
    #: Weight of the load-balancing loss (null disables).
    lb_loss_weight: Optional[float] = setting(0.01, ge=0)
    #: Weight of the router z-loss (null disables).
    z_loss_weight: Optional[float] = setting(None, ge=0)
    #: Make every k-th block an MoE block (blocks k-1, 2k-1, ...); 1 = all blocks.
    every: int = setting(1, ge=1)
    #: Explicit block indices to turn into MoE blocks (overrides ``every``).
    blocks: Optional[list[int]] = setting(None, ge=0, items=True, integer=True)
    #: ``portable`` (olmx's MoE, runs everywhere, the tested reference), ``olmo_core``
    #: (OLMo-core's v1 MoE with its Triton/CUDA kernels: CUDA only, not with expert parallelism
    #: over replicated parameters (ddp_ep) or a shared expert) or ``auto``: portable for now,
    #: because olmx has not yet run the olmo_core path on a GPU (its parity test is marked gpu)
    #: and the two paths' checkpoints differ in their MoE keys (a resume must keep its backend);
    #: the plan says which and why.
    backend: Backend = setting(Backend.auto)


def moe_blocks(cfg: MoEConfig, n_layers: int) -> list[int]:
    """Indices of the blocks that become MoE blocks."""
    if cfg.blocks is not None:
        return sorted(set(cfg.blocks))
    return [i for i in range(n_layers) if (i + 1) % cfg.every == 0]


def expert_hidden(cfg: MoEConfig, model: Any) -> int:
    """Hidden width of one routed expert."""
    return cfg.hidden_size if cfg.hidden_size is not None else model.hidden_size


@dataclass(frozen=True)
class MoEDecisions:
    """What the plan decided for ``layers=[moe]``."""

    #: The implementation the plan chose: ``portable`` or ``olmo_core``.
    backend: str = "portable"
