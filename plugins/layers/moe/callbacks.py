"""Trainer callbacks of the MoE plugin."""

from __future__ import annotations

from dataclasses import dataclass

from olmo_core.train.callbacks import Callback

from olmx_plugins.layers.moe.modules import moe_layers


@dataclass
class ExpertBiasCallback(Callback):
    """Aux-loss-free balancing: update every MoE layer's expert bias once per optimizer step
    (all ranks; the token counts are all-reduced)."""

    def pre_optim_step(self) -> None:
        """After the last micro-batch's backward, before the step."""
        for layer in moe_layers(self.trainer.train_module.model):
            layer.update_expert_bias()
