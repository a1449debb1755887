"""MXFP8 linear layers: OCP microscaling FP8 on SM100+, or torchao's emulation anywhere.

The format (OCP Microscaling Formats (MX) v1.0, §5; torchao 0.15 ``prototype/mx_formats``):
a GEMM operand is cut into blocks of 32 consecutive elements along its contraction dimension;
each block shares one E8M0 scale (a power of two, 2^-127..2^127) and stores its elements as
FP8 E4M3 (3 mantissa bits, largest value 448). A linear layer runs three GEMMs, each with its
operands quantized along its own contraction dimension: output = X W^T (in_features),
grad_input = dY W (out_features) and grad_weight = dY^T X (tokens). So ``in_features``,
``out_features`` and the tokens of one micro-batch must all be multiples of 32 (torchao does
not pad). Scale rules: ``rceil`` takes 2^ceil(log2(amax / 448)), so no element saturates
(NVIDIA's cuBLAS rule, OLMo-core's standard recipe); ``floor`` takes
2^(floor(log2 amax) - 8), the OCP spec's basic rule, which saturates elements above
448 x scale. Per element, rounding to 3 mantissa bits costs at most 2^-4 relative error
(normal range) or 2^-10 x scale absolute (E4M3 subnormals); ``floor``'s saturation adds up
to 1/8 relative. tests/plugins/precision/test_mxfp8_numerics.py checks these bounds.

Which layers: every plain ``nn.Linear`` whose dimensions are multiples of 32, except those
whose owner marks them ``keep`` in the plan's layer list (:class:`olmx.plan.linears.LinearLayer`:
the output head, whose logits feed the softmax and loss, and Engram's projections) and those
matching ``exclude``; the plan records the list (decision ``convert``) and the worker converts
exactly it. (MoE routers are plain weights, not ``nn.Linear``.) ``nn.Linear`` subclasses stay
too: torchao converts by replacing the module's class,
which would drop the subclass's own methods (such as a custom initialisation).

Where: the conversion edits the built model before any parallelism, where OLMo-core's
``parallelize_model`` applies ``float8_config`` (before context parallelism, activation
checkpointing, compile and FSDP/DDP). On SM100 it goes through OLMo-core's
``Float8Config(ao_mx=AOMXLinearConfig(...))`` (``Transformer.apply_fp8``); with
``emulate=true`` it calls torchao's ``quantize_`` directly, because OLMo-core refuses
``ao_mx`` below SM100.
"""

from __future__ import annotations

from typing import Any

from olmx.api import Context, World
from olmx.errors import ConfigError
from olmx_plugins.precision.lowp import (
    BLOCK_SIZE,
    MIN_COMPUTE_CAPABILITY,
    LowPrecisionPlugin,
    MXFP8Config,
    hardware,
    keep_reason,
)

__all__ = ["MXFP8", "MXFP8Config", "keep_reason"]


class MXFP8Precision(LowPrecisionPlugin):
    """MXFP8 linear layers through OLMo-core's Float8Config (SM100+) or torchao's emulation."""

    name = "mxfp8"
    api = ">=3.0,<4"
    Config = MXFP8Config

    label = "MXFP8"
    multiple = BLOCK_SIZE
    unit = "the MX block size"

    def min_capability(self, cfg: MXFP8Config) -> tuple[int, int]:
        """SM100's (:data:`MIN_COMPUTE_CAPABILITY`)."""
        return MIN_COMPUTE_CAPABILITY

    def hardware_refusal(self, cfg: MXFP8Config, world: World, need: tuple[int, int]) -> str:
        """Block-scaled FP8 tensor cores and what to use instead."""
        return (
            f"MXFP8 needs an NVIDIA GPU with compute capability {'.'.join(map(str, need))} or newer (SM100: B200, "
            f"GB200, B300), whose tensor cores multiply block-scaled FP8; found {hardware(world)}. Use "
            f"precision=bf16, or set precision.emulate=true to run torchao's emulated MX recipe (same numerics, slow)"
        )

    def tokens_refusal(self, tokens: int, how: str) -> str:
        """The weight-gradient GEMM's blocks."""
        return (
            f"MXFP8 quantizes the weight-gradient GEMM along the tokens of a micro-batch, which must be a "
            f"multiple of the block size {BLOCK_SIZE}: {how} = {tokens} tokens"
        )

    def check_model(self, cfg: MXFP8Config, ctx: Context) -> None:
        """``model.d_model``, a dimension of every attention and feed-forward linear layer, must
        be a multiple of the block size."""
        d_model = ctx.run.model.d_model
        if d_model % BLOCK_SIZE:
            raise ConfigError(
                "model.d_model",
                f"{d_model} is not a multiple of the MX block size {BLOCK_SIZE}; every attention and "
                f"feed-forward linear layer has d_model as a dimension, so MXFP8 could convert none of them "
                f"(use precision=bf16, or a d_model divisible by {BLOCK_SIZE})",
            )

    def format_row(self, cfg: MXFP8Config) -> tuple[str, str]:
        """The block format and its scale rule."""
        return (
            "format",
            f"OCP MX FP8: E4M3 elements, blocks of {BLOCK_SIZE} sharing one E8M0 scale "
            f"({cfg.scale_calculation_mode}); X, W and dY quantized per GEMM along its contraction dim",
        )

    def kernels(self, cfg: MXFP8Config) -> str:
        """torchao's emulation or cuBLAS's block-scaled GEMMs."""
        return (
            "EMULATED: torchao quantizes and dequantizes each operand in software, then multiplies in high "
            "precision (slow; for checking numerics)"
            if cfg.emulate
            else "cuBLAS block-scaled FP8 GEMMs through OLMo-core Float8Config(ao_mx=AOMXLinearConfig("
            "kernel_preference=auto, mxfp8_cast_kernel_choice=triton, "
            f"scale_calculation_mode={cfg.scale_calculation_mode}))"
        )

    def apply_model(self, cfg: MXFP8Config, model: Any, plan: Any) -> None:
        """Convert the plan's linear layers of the built model to MXFP8 (before any parallelism)."""
        from olmx_plugins.precision.mx import apply_mxfp8

        apply_mxfp8(model, cfg, convert=self.decided(plan).convert, emulate=cfg.emulate)


MXFP8 = MXFP8Precision()
