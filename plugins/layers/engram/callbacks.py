"""Trainer callbacks of the Engram plugin."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from olmo_core.train.callbacks import Callback
from torch.distributed.tensor import DTensor

from olmx_plugins.layers.engram.sharding import EngramTable, sharded_tables_grad_sq_norm


@dataclass
class EngramGradClipCallback(Callback):
    """Global-norm gradient clipping over the model and its sharded Engram tables, whose
    gradients live on their own mesh: total^2 = |other grads|^2 + |table grads|^2."""

    max_norm: float = 1.0

    @torch.no_grad()
    def pre_optim_step(self) -> None:
        """Clip before the optimizer step; record the norm like OLMo-core does."""
        model = self.trainer.train_module.model
        tables = {id(t.weight) for t in model.modules() if isinstance(t, EngramTable)}
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        other = [g for p, g in zip([p for p in model.parameters() if p.grad is not None], grads)
                 if id(p) not in tables]
        sq = torch.zeros(())
        for g in other:
            sq = sq + (g.full_tensor() if isinstance(g, DTensor) else g).float().pow(2).sum()
        table_sq = sharded_tables_grad_sq_norm(model)
        if table_sq is not None:
            sq = sq + table_sq.to(sq.device)
        total = sq.sqrt()
        coef = (self.max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef)
        self.trainer.record_metric("total grad norm", total, reduce_type=None, namespace="optim")
