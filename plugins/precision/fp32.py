"""Full fp32: parameters, compute and gradient reduction in float32 (the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Contribution, World


@dataclass
class FP32Config:
    """``fp32`` has no settings."""


class FP32Precision:
    """Leaves OLMo-core's float32 defaults in place."""

    name = "fp32"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = FP32Config

    def resolve(self, cfg: Any, run: Any, world: World) -> Contribution:
        """Nothing to check: fp32 runs everywhere."""
        return Contribution(rows=[("parameters", "float32"), ("compute", "float32"),
                                  ("gradient reduction", "float32")])

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Any) -> None:
        """Nothing to set."""


FP32 = FP32Precision()
