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

from olmx.api import Context, Contribution
from olmx.errors import ConfigError
from olmx_plugins.precision.lowp import (
    BLOCK_SIZE,
    MIN_COMPUTE_CAPABILITY,
    ConversionDecisions,
    LowPrecisionPlugin,
    MXFP8Config,
    hardware,
    keep_reason,
    missing_torchao,
    shown,
    split_planned,
)

__all__ = ["MXFP8", "MXFP8Config", "keep_reason"]


class MXFP8Precision(LowPrecisionPlugin):
    """MXFP8 linear layers through OLMo-core's Float8Config (SM100+) or torchao's emulation."""

    name = "mxfp8"
    api = ">=3.0,<4"
    Config = MXFP8Config

    def resolve(self, cfg: MXFP8Config, ctx: Context) -> Contribution:
        """Check the hardware, the model's dimensions and the micro-batch; list the converted
        and the kept linear layers; state what is kept in which dtype."""
        run, world = ctx.run, ctx.world
        if missing := missing_torchao():
            raise ConfigError(self.section, missing)
        cc = world.compute_capability
        native = world.device == "cuda" and (cc is None or cc >= MIN_COMPUTE_CAPABILITY)
        if not native and not cfg.emulate:
            need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
            raise ConfigError(
                self.section,
                f"MXFP8 needs an NVIDIA GPU with compute capability {need} or newer (SM100: B200, GB200, B300), whose "
                f"tensor cores multiply block-scaled FP8; found {hardware(world)}. Use precision=bf16, or set "
                f"precision.emulate=true to run torchao's emulated MX recipe (same numerics, slow)",
            )
        tokens, how = ctx.tokens_per_rank()
        if tokens % BLOCK_SIZE:
            raise ConfigError(
                "trainer.micro_batch_size",
                f"MXFP8 quantizes the weight-gradient GEMM along the tokens of a micro-batch, which must be a "
                f"multiple of the block size {BLOCK_SIZE}: {how} = {tokens} tokens",
            )
        if run.model.d_model % BLOCK_SIZE:
            raise ConfigError(
                "model.d_model",
                f"{run.model.d_model} is not a multiple of the MX block size {BLOCK_SIZE}; every attention and "
                f"feed-forward linear layer has d_model as a dimension, so MXFP8 could convert none of them "
                f"(use precision=bf16, or a d_model divisible by {BLOCK_SIZE})",
            )

        converted, kept = split_planned(
            ctx, exclude=cfg.exclude, multiple=BLOCK_SIZE, unit="the MX block size", section=self.section
        )
        kernels = (
            "EMULATED: torchao quantizes and dequantizes each operand in software, then multiplies in high "
            "precision (slow; for checking numerics)"
            if cfg.emulate
            else "cuBLAS block-scaled FP8 GEMMs through OLMo-core Float8Config(ao_mx=AOMXLinearConfig("
            "kernel_preference=auto, mxfp8_cast_kernel_choice=triton, "
            f"scale_calculation_mode={cfg.scale_calculation_mode}))"
        )
        rows = [
            (
                "format",
                f"OCP MX FP8: E4M3 elements, blocks of {BLOCK_SIZE} sharing one E8M0 scale "
                f"({cfg.scale_calculation_mode}); X, W and dY quantized per GEMM along its contraction dim",
            ),
            ("hardware", hardware(world) + ("" if cc or world.device != "cuda" else ", checked on the worker")),
            ("kernels", kernels),
            ("MXFP8 linear layers", f"{len(converted)}: {shown(converted)}"),
        ]
        rows += [(f"kept in {ctx.dtypes.param}", f"{shown(v)}: {k}") for k, v in kept.items()]
        rows += ctx.dtype_rows(compute_label="compute outside MXFP8 layers")
        rows.append(("tokens per micro-batch", f"{tokens} ({how}), a multiple of {BLOCK_SIZE}"))
        if cfg.emulate:
            rows.append(("warning", "emulated MXFP8 is slow: use it to check numerics, not to train for speed"))
        return Contribution(rows=rows, decisions=ConversionDecisions(convert=sorted(layer.name for layer in converted)))

    def apply_model(self, cfg: MXFP8Config, model: Any, plan: Any) -> None:
        """Convert the plan's linear layers of the built model to MXFP8 (before any parallelism)."""
        from olmx_plugins.precision.mx import apply_mxfp8

        apply_mxfp8(model, cfg, convert=self.decided(plan).convert, emulate=cfg.emulate)


MXFP8 = MXFP8Precision()
