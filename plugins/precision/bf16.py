"""bfloat16 compute with float32 master weights and float32 gradient reduction.

The plugin only chooses the dtypes (:meth:`BF16Precision.dtypes`); the core applies them by
what the mesh can do, so that the optimizer always updates float32 master weights (pure bf16
parameters lose small updates: research note ulysses-mxfp8-bf16.md §6):

* a data-parallel strategy that shards parameters (``mesh.shards_params``: fsdp, hsdp):
  FSDP2's ``MixedPrecisionPolicy`` through OLMo-core's ``dp_config.param_dtype`` /
  ``reduce_dtype``. The sharded parameters (master weights), their gradients and the
  optimizer state stay float32; each block's parameters are all-gathered in ``param_dtype``
  and its gradients reduce-scattered in ``reduce_dtype``;
* otherwise (ddp, one process): ``torch.autocast`` over float32 parameters (OLMo-core's
  ``autocast_precision``). OLMo-core's DDP ``param_dtype`` would cast the whole model, master
  weights included, so it is not used; DDP all-reduces the float32 gradients, which is why
  ``reduce_dtype`` can only be float32 there.

On CPUs without bf16 units (AVX2 only) bf16 is several times slower than fp32
(benchmarks/results/precision.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Dtypes, Mesh, PrecisionPlugin, World


@dataclass(frozen=True)
class BF16Config:
    """Settings of ``bf16``."""

    #: dtype of the parameters as compute uses them: where parameters are sharded (fsdp,
    #: hsdp) the dtype FSDP all-gathers the float32 master shards into; elsewhere the
    #: torch.autocast dtype (float32 turns autocast off). Master weights are always float32.
    param_dtype: str = "bfloat16"
    #: dtype in which gradients are reduced across ranks (sharded parameters only). ddp
    #: reduces the float32 gradients of its float32 parameters, so only float32 is possible there.
    reduce_dtype: str = "float32"


class BF16Precision(PrecisionPlugin):
    """bfloat16 compute over float32 master weights; the core picks the mechanism."""

    name = "bf16"
    api = ">=3.0,<4"
    Config = BF16Config

    def dtypes(self, cfg: BF16Config, run: Any, world: World, mesh: Mesh) -> Dtypes:
        """The configured dtypes (the core checks them against the mesh)."""
        return Dtypes(param=cfg.param_dtype, reduce=cfg.reduce_dtype)

    def resolve(self, cfg: BF16Config, ctx: Context) -> Contribution:
        """Where each tensor lives in which dtype."""
        rows = ctx.dtype_rows()
        if ctx.world.device == "cpu" and cfg.param_dtype == "bfloat16":
            rows.append(("note", "most CPUs have no bf16 units: slower than fp32 there"))
        return Contribution(rows=rows)


BF16 = BF16Precision()
