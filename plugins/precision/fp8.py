"""FP8 linear layers for Hopper and Ada (SM89/SM90): torchao float8 training through OLMo-core's Float8Config.

Each converted ``nn.Linear`` runs its three GEMMs (output, input gradient, weight gradient) in
FP8 through ``torch._scaled_mm``: operands are scaled into E4M3 (E5M2 for gradients where the
recipe says so) and the products accumulate in higher precision. The recipes are torchao's
(``torchao.float8.Float8LinearRecipeName``, OLMo-core's ``AOFloat8LinearRecipe``):

* ``tensorwise``: one dynamic scale per tensor (amax / E4M3's largest value). Compute
  capability 8.9+ (L40S, L4, H100, H200), the fastest recipe;
* ``rowwise``: one scale per row of each operand, more robust to outliers. 9.0+ (H100/H200);
* ``rowwise_with_gw_hp``: rowwise, with the weight gradient in high precision. 9.0+.

Which layers: every plain ``nn.Linear`` whose dimensions are multiples of 16 (``_scaled_mm``'s
alignment, OLMo-core's filter), except the layers marked ``keep`` (the output head, Engram's
projections; the rule every low-precision plugin shares:
:func:`olmx_plugins.precision.lowp.keep_reason`). The tokens a linear layer sees per micro-batch
must be a multiple of 16 too (the weight-gradient GEMM contracts over them); the plan's checks
and rows are every low-precision plugin's
(:meth:`olmx_plugins.precision.lowp.LowPrecisionPlugin.resolve`). The rest of the model runs in
``param_dtype`` as under ``bf16``. Without ``torch.compile`` float8 is slower than bf16 (its
casts run as separate kernels): ``trainer.compile=auto`` turns compile on with CUDA.

``emulate=true`` runs torchao's emulation (the same scaling, matmuls in high precision) on any
device, this CPU included: for numerics, not speed. The conversion edits the built model
before any parallelism, where OLMo-core's ``parallelize_model`` applies ``float8_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from olmx.api import Context, World, setting
from olmx_plugins.precision.lowp import LowPrecisionConfig, LowPrecisionPlugin, hardware

#: Recipe -> the compute capability its scaled GEMMs need.
RECIPES: dict[str, tuple[int, int]] = {"tensorwise": (8, 9), "rowwise": (9, 0), "rowwise_with_gw_hp": (9, 0)}


class Recipe(StrEnum):
    """Values of ``recipe`` (torchao's ``Float8LinearRecipeName``)."""

    tensorwise = "tensorwise"
    rowwise = "rowwise"
    rowwise_with_gw_hp = "rowwise_with_gw_hp"


#: ``torch._scaled_mm`` needs every GEMM dimension to be a multiple of this.
ALIGNMENT = 16


@dataclass(frozen=True)
class FP8Config(LowPrecisionConfig):
    """Settings of ``fp8``."""

    #: torchao float8 recipe: ``tensorwise`` (SM89+), ``rowwise`` or ``rowwise_with_gw_hp`` (SM90+).
    recipe: Recipe = setting(Recipe.tensorwise)


class FP8Precision(LowPrecisionPlugin):
    """torchao float8 linear layers (tensorwise / rowwise) through OLMo-core's Float8Config."""

    name = "fp8"
    api = ">=3.0,<4"
    Config = FP8Config

    label = "FP8"
    multiple = ALIGNMENT
    unit = "FP8's alignment"

    def min_capability(self, cfg: FP8Config) -> tuple[int, int]:
        """The recipe's (:data:`RECIPES`)."""
        return RECIPES[cfg.recipe]

    def hardware_refusal(self, cfg: FP8Config, world: World, need: tuple[int, int]) -> str:
        """FP8 tensor cores and what to use instead."""
        return (
            f"the {cfg.recipe} recipe needs an NVIDIA GPU with compute capability {need[0]}.{need[1]} or newer "
            f"(FP8 tensor cores: {'L40S, L4, ' if need < (9, 0) else ''}H100, H200, B200); "
            f"found {hardware(world)}. "
            "Use precision=bf16, another recipe, or precision.emulate=true for torchao's emulation"
        )

    def tokens_refusal(self, tokens: int, how: str) -> str:
        """The weight-gradient GEMM's alignment."""
        return (
            f"FP8's weight-gradient GEMM contracts over the tokens of a micro-batch, which must be a multiple "
            f"of {ALIGNMENT}: {how} = {tokens} tokens"
        )

    def format_row(self, cfg: FP8Config) -> tuple[str, str]:
        """The recipe's scaling."""
        return (
            "recipe",
            f"{cfg.recipe}: E4M3 operands, "
            + ("one scale per tensor" if cfg.recipe == "tensorwise" else "one scale per row")
            + (", weight gradient in high precision" if cfg.recipe == "rowwise_with_gw_hp" else ""),
        )

    def kernels(self, cfg: FP8Config) -> str:
        """torchao's emulation or ``torch._scaled_mm``."""
        return (
            "EMULATED: torchao scales and casts each operand, then multiplies in high precision (slow; "
            "for checking numerics)"
            if cfg.emulate
            else f"torch._scaled_mm FP8 GEMMs through OLMo-core Float8Config(ao_recipe={cfg.recipe})"
        )

    def notes(self, cfg: FP8Config, ctx: Context) -> list[tuple[str, str]]:
        """That float8 needs ``torch.compile``, where the run compiles."""
        if not cfg.emulate and ctx.execution is not None and ctx.execution.compile:
            return [("note", "float8 needs torch.compile to be faster than bf16: torch.compile is on for this run")]
        return []

    def apply_model(self, cfg: FP8Config, model: Any, plan: Any) -> None:
        """Convert the planned linear layers to torchao ``Float8Linear`` (before any parallelism)."""
        from olmx_plugins.precision.float8 import apply_float8

        apply_float8(model, recipe=cfg.recipe, convert=self.decided(plan).convert, emulate=cfg.emulate)


FP8 = FP8Precision()
