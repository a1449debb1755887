"""Automatic precision: bfloat16 compute (float32 master weights and reduction) on CUDA, float32 on CPUs.

The default of ``olmx train``: on GPUs bf16 is the fast configuration every OLMo-core training
script uses (and the only dtype besides fp16 that flash-attention takes), while most CPUs have
no bf16 units and run it several times slower than fp32 (benchmarks/results/precision.md).
The plugin only chooses the dtypes; the core applies them by what the mesh can do (FSDP2 mixed
precision where parameters are sharded, ``torch.autocast`` elsewhere). ``precision=bf16`` or
``precision=fp32`` choose explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, Dtypes, Mesh, PrecisionPlugin, World


@dataclass(frozen=True)
class AutoPrecisionConfig:
    """``auto`` has no settings: it follows the run's device."""


class AutoPrecision(PrecisionPlugin):
    """bfloat16 compute on CUDA, float32 on CPUs."""

    name = "auto"
    api = ">=3.0,<4"
    Config = AutoPrecisionConfig

    def dtypes(self, cfg: Any, run: Any, world: World, mesh: Mesh) -> Dtypes:
        """bfloat16 with float32 reduction on CUDA; float32 throughout elsewhere."""
        return Dtypes(param="bfloat16") if world.device == "cuda" else Dtypes()

    def resolve(self, cfg: Any, ctx: Context) -> Contribution:
        """What was chosen for this device, and how the core applies it."""
        why = (
            "bfloat16: the run is on CUDA"
            if ctx.world.device == "cuda"
            else "float32: the run is on CPUs, which are slower in bf16 (precision=bf16 to force it)"
        )
        return Contribution(rows=[("chosen", why), *ctx.dtype_rows()])


AUTO = AutoPrecision()
