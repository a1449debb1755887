"""DDP for a model whose sharded Engram tables must stay out of it.

Why this exists: OLMo-core 3.0.0's ``Transformer.apply_ddp``
(``olmo_core/nn/transformer/model.py``) calls ``replicate(self, device_mesh=dp_mesh,
bucket_cap_mb=100)`` and offers no way to pass ``ignored_modules``. A ``1d``/``2d``-sharded
Engram table is a DTensor on a mesh of its own (``engram_shard``) whose gradients are exchanged
by the table itself (:mod:`.sharding`); given to ``replicate`` it would be localised to its
shard and its rows' gradients averaged across ranks that hold different rows. Where no table is
sharded, :class:`~.block.EngramModelMixin` calls OLMo-core's own ``apply_ddp`` unchanged.

:func:`apply_ddp_ignoring` is that function's body (the dtype cast, the ``torch.compile`` DDP
setting, ``replicate``, and the hooks that keep CPU inputs on the CPU) with ``ignored_modules``
added. Keep it in step with OLMo-core's when the pin moves (``test_engram_sharding`` runs both
DDP paths on 2 gloo processes).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed import DeviceMesh

__all__ = ["apply_ddp_ignoring"]


def apply_ddp_ignoring(
    model: nn.Module,
    *,
    ignored_modules: Iterable[nn.Module],
    dp_mesh: DeviceMesh | None = None,
    param_dtype: torch.dtype | None = None,
    compile_enabled: bool = False,
    autograd_compile_enabled: bool = False,
) -> None:
    """OLMo-core 3.0.0's ``Transformer.apply_ddp`` on ``model`` (an OLMo-core ``Transformer``),
    leaving ``ignored_modules`` (and their parameters) out of DDP."""
    from olmo_core.nn.transformer import model as olmo_model
    from torch.distributed._composable.replicate import replicate

    dtype = model.dtype
    target_dtype = param_dtype or dtype
    if target_dtype != dtype:
        model.to(dtype=target_dtype)
    if compile_enabled:
        torch._dynamo.config.optimize_ddp = (
            "python_reducer_without_compiled_forward" if autograd_compile_enabled else "ddp_optimizer"
        )
    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100, ignored_modules=list(ignored_modules))
    # Some inputs must stay on the CPU; DDP would move them to the model's device.
    model.register_forward_pre_hook(olmo_model._hide_cpu_inputs_from_torch, prepend=True, with_kwargs=True)
    model.register_forward_pre_hook(olmo_model._unhide_cpu_inputs_from_torch, prepend=False, with_kwargs=True)
