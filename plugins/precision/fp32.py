"""Full fp32: parameters, compute and gradient reduction in float32 (the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Context, Contribution, PrecisionPlugin


@dataclass(frozen=True)
class FP32Config:
    """``fp32`` has no settings."""


class FP32Precision(PrecisionPlugin):
    """Leaves OLMo-core's float32 defaults in place (the default :class:`olmx.api.Dtypes`)."""

    name = "fp32"
    api = ">=3.0,<4"
    Config = FP32Config

    def resolve(self, cfg: Any, ctx: Context) -> Contribution:
        """Nothing to check: fp32 runs everywhere."""
        return Contribution(rows=[("parameters", "float32"), ("compute", "float32"), ("gradient reduction", "float32")])


FP32 = FP32Precision()
