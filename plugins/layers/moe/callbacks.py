"""Trainer callbacks of the MoE plugin and of expert-parallel strategies."""

from __future__ import annotations

from dataclasses import dataclass

from olmo_core.train.callbacks import Callback

from olmx_plugins.layers.moe.expert_parallel import clip_grad_norm_
from olmx_plugins.layers.moe.modules import moe_layers


@dataclass
class ExpertBiasCallback(Callback):
    """Aux-loss-free balancing: update every MoE layer's expert bias once per optimizer step
    (all ranks; the token counts are all-reduced)."""

    def pre_optim_step(self) -> None:
        """After the last micro-batch's backward, before the step."""
        for layer in moe_layers(self.trainer.train_module.model):
            layer.update_expert_bias()


@dataclass
class MixedGradClipCallback(Callback):
    """Global-norm clipping over plain-tensor (dense, DDP) and DTensor (expert) gradients,
    which OLMo-core's own clipping refuses to mix; the train module's clipping is disabled."""

    max_norm: float = 1.0

    def pre_optim_step(self) -> None:
        """Clip before the optimizer step and record the norm like OLMo-core does."""
        norm = clip_grad_norm_(self.trainer.train_module.model.parameters(), self.max_norm)
        self.trainer.record_metric("total grad norm", norm, reduce_type=None, namespace="optim")
