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
projections; the same rule as ``mxfp8``: :func:`olmx_plugins.precision.lowp.keep_reason`). The tokens a
linear layer sees per micro-batch must be a multiple of 16 too (the weight-gradient GEMM
contracts over them). The rest of the model runs in ``param_dtype`` as under ``bf16``.
Without ``torch.compile`` float8 is slower than bf16 (its casts run as separate kernels):
``trainer.compile=auto`` turns compile on with CUDA.

``emulate=true`` runs torchao's emulation (the same scaling, matmuls in high precision) on any
device, this CPU included: for numerics, not speed. The conversion edits the built model
before any parallelism, where OLMo-core's ``parallelize_model`` applies ``float8_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from olmx.api import Context, Contribution, setting
from olmx.errors import ConfigError
from olmx_plugins.precision.lowp import (
    ConversionDecisions,
    LowPrecisionConfig,
    LowPrecisionPlugin,
    hardware,
    missing_torchao,
    shown,
    split_planned,
)

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

    def resolve(self, cfg: FP8Config, ctx: Context) -> Contribution:
        """Check the recipe against the hardware and the model's dimensions; list the converted
        and the kept linear layers; the layers' ``[in, out]`` names the plan and the worker agree on."""
        if missing := missing_torchao():
            raise ConfigError(self.section, missing)
        need, world = RECIPES[cfg.recipe], ctx.world
        cc = world.compute_capability
        native = world.device == "cuda" and (cc is None or cc >= need)
        if not native and not cfg.emulate:
            raise ConfigError(
                self.section,
                f"the {cfg.recipe} recipe needs an NVIDIA GPU with compute capability {need[0]}.{need[1]} or newer "
                f"(FP8 tensor cores: {'L40S, L4, ' if need < (9, 0) else ''}H100, H200, B200); "
                f"found {hardware(world)}. "
                "Use precision=bf16, another recipe, or precision.emulate=true for torchao's emulation",
            )
        tokens, how = ctx.tokens_per_rank()
        if tokens % ALIGNMENT:
            raise ConfigError(
                "trainer.micro_batch_size",
                f"FP8's weight-gradient GEMM contracts over the tokens of a micro-batch, which must be a multiple "
                f"of {ALIGNMENT}: {how} = {tokens} tokens",
            )
        converted, kept = split_planned(
            ctx, exclude=cfg.exclude, multiple=ALIGNMENT, unit="FP8's alignment", section=self.section
        )
        kernels = (
            "EMULATED: torchao scales and casts each operand, then multiplies in high precision (slow; "
            "for checking numerics)"
            if cfg.emulate
            else f"torch._scaled_mm FP8 GEMMs through OLMo-core Float8Config(ao_recipe={cfg.recipe})"
        )
        rows = [
            (
                "recipe",
                f"{cfg.recipe}: E4M3 operands, "
                + ("one scale per tensor" if cfg.recipe == "tensorwise" else "one scale per row")
                + (", weight gradient in high precision" if cfg.recipe == "rowwise_with_gw_hp" else ""),
            ),
            ("hardware", hardware(world) + ("" if cc or world.device != "cuda" else ", checked on the worker")),
            ("kernels", kernels),
            ("FP8 linear layers", f"{len(converted)}: {shown(converted)}"),
            *((f"kept in {ctx.dtypes.param}", f"{shown(v)}: {k}") for k, v in kept.items()),
            *ctx.dtype_rows(compute_label="compute outside FP8 layers"),
            ("tokens per micro-batch", f"{tokens} ({how}), a multiple of {ALIGNMENT}"),
        ]
        if not cfg.emulate and ctx.execution is not None and ctx.execution.compile:
            rows.append(("note", "float8 needs torch.compile to be faster than bf16: torch.compile is on for this run"))
        if cfg.emulate:
            rows.append(("warning", "emulated FP8 is slow: use it to check numerics, not to train for speed"))
        return Contribution(rows=rows, decisions=ConversionDecisions(convert=sorted(layer.name for layer in converted)))

    def apply_model(self, cfg: FP8Config, model: Any, plan: Any) -> None:
        """Convert the planned linear layers to torchao ``Float8Linear`` (before any parallelism)."""
        from olmx_plugins.precision.float8 import apply_float8

        apply_float8(model, recipe=cfg.recipe, convert=self.decided(plan).convert, emulate=cfg.emulate)


FP8 = FP8Precision()
