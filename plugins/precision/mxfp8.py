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

Which layers: every plain ``nn.Linear`` whose dimensions are multiples of 32, except the
output head (its logits feed the softmax and loss; OLMo-core never converts it), MoE routers
(small score errors flip the top-k choice) and Engram's tables and projections; modules are
recognised by the name patterns of :data:`KEEP`, so layers added by plugins follow the same
rule. ``nn.Linear`` subclasses stay too: torchao converts by replacing the module's class,
which would drop the subclass's own methods (such as a custom initialisation).

Where: the conversion edits the built model before any parallelism, where OLMo-core's
``parallelize_model`` applies ``float8_config`` (before context parallelism, activation
checkpointing, compile and FSDP/DDP). On SM100 it goes through OLMo-core's
``Float8Config(ao_mx=AOMXLinearConfig(...))`` (``Transformer.apply_fp8``); with
``emulate=true`` it calls torchao's ``quantize_`` directly, because OLMo-core refuses
``ao_mx`` below SM100.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from olmx.errors import ConfigError
from olmx.plan.linears import LinearLayer, model_linears
from olmx.api import Contribution, World
from olmx_plugins.precision.bf16 import SHARDED, apply_mixed_precision, resolve_mixed_precision, sharded

#: Elements sharing one E8M0 scale (OCP MX v1.0).
BLOCK_SIZE = 32
#: Compute capability from which MX block-scaled FP8 tensor cores exist (Blackwell: B200, GB200, B300).
MIN_COMPUTE_CAPABILITY = (10, 0)
SCALE_MODES = ("rceil", "floor")
#: Module-name patterns (fnmatch, on fully-qualified names) kept in high precision, and why.
KEEP: tuple[tuple[str, str], ...] = (
    ("lm_head.*", "output head: its logits feed the softmax and loss (OLMo-core never converts it)"),
    ("*router*", "MoE router: small score errors flip the top-k expert choice"),
    ("*engram*", "Engram table lookups and projections"),
)
#: Parallel plugins that shard the sequence, so a linear layer sees tokens / degree per micro-batch.
SEQUENCE_SHARDING = ("ulysses", "ring", "cp")


@dataclass
class MXFP8Config:
    """Settings of ``mxfp8``."""

    #: Run torchao's emulated MX recipe (quantize, dequantize, high-precision matmul) instead
    #: of SM100 kernels: the same numerics on any device, this CPU included, but slow (about
    #: 2.6x fp32 on a CPU, far slower than bf16 on a GPU). For checking numerics, not for speed.
    emulate: bool = False
    #: How each block's E8M0 scale is chosen: ``rceil`` (2^ceil(log2(amax/448)), no element
    #: saturates; NVIDIA cuBLAS, OLMo-core's standard recipe) or ``floor`` (OCP's basic rule;
    #: saturates the largest elements of a block).
    scale_calculation_mode: str = "rceil"
    #: dtype of everything that is not an MX linear layer, as ``precision.bf16.param_dtype``
    #: (FSDP all-gather dtype, else autocast). null: bfloat16, except float32 on CPU without
    #: fsdp/hsdp (torchao 0.15's MXLinear follows CUDA autocast only).
    param_dtype: str | None = None
    #: dtype of the gradient reduction, as ``precision.bf16.reduce_dtype``.
    reduce_dtype: str = "float32"
    #: More module-name patterns (fnmatch on names such as ``blocks.0.attention.w_q``) to keep
    #: in high precision, besides the output head, MoE routers and Engram.
    exclude: list[str] = field(default_factory=list)


def keep_reason(name: str, in_features: int, out_features: int, *, exclude: list[str] | tuple[str, ...] = (),
                subclass: bool = False) -> str | None:
    """Why the linear layer ``name`` stays in high precision, or None if it becomes MXFP8.
    The one rule, used by the plan (torch-free) and by the conversion of the built model."""
    for pattern in exclude:
        if fnmatch.fnmatchcase(name, pattern):
            return f"precision.mxfp8.exclude matches '{pattern}'"
    for pattern, reason in KEEP:
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    if subclass:
        return "nn.Linear subclass: torchao converts by replacing the class, dropping its own methods"
    bad = [f"{key}={n}" for key, n in (("in_features", in_features), ("out_features", out_features))
           if n % BLOCK_SIZE]
    if bad:
        return f"{', '.join(bad)} not a multiple of the MX block size {BLOCK_SIZE}"
    return None


def tokens_per_micro_batch(run: Any) -> tuple[int, str]:
    """Tokens one linear layer sees per micro-batch on one rank, and how they come about."""
    tokens = run.trainer.micro_batch_size * run.data.seq_len
    how = f"trainer.micro_batch_size={run.trainer.micro_batch_size} x data.seq_len={run.data.seq_len}"
    for name, cfg in run.parallel.items():
        degree = getattr(cfg, "degree", None)
        if name in SEQUENCE_SHARDING and degree:
            tokens //= degree
            how += f" / parallel.{name}.degree={degree}"
    return tokens, how


def resolve_param_dtype(cfg: MXFP8Config, *, device: str, parallel: Any) -> str:
    """The dtype of the non-MX parts: ``cfg.param_dtype``, its null default resolved for the
    device and the parallel strategies (names) of the run."""
    if cfg.param_dtype is not None:
        return cfg.param_dtype
    return "float32" if device == "cpu" and not any(name in SHARDED for name in parallel) else "bfloat16"


def hardware(world: World) -> str:
    """The device as the plan and the refusal name it."""
    if world.device == "cpu":
        return "CPU only (no CUDA GPU)"
    cc = world.compute_capability
    return f"{world.device_name} (compute capability {'.'.join(map(str, cc)) if cc else 'unknown'})"


def _shown(layers: list[LinearLayer]) -> str:
    """Layer names, those repeated over blocks folded into ``blocks.*.name (xN)``."""
    groups: dict[str, list[str]] = {}
    for layer in layers:
        parts = layer.name.split(".")
        key = ".".join(["blocks", "*", *parts[2:]]) if parts[0] == "blocks" and len(parts) > 2 else layer.name
        groups.setdefault(key, []).append(layer.name)
    return ", ".join(f"{key} (x{len(names)})" if len(names) > 1 else names[0] for key, names in groups.items())


class MXFP8Precision:
    """MXFP8 linear layers through OLMo-core's Float8Config (SM100+) or torchao's emulation."""

    name = "mxfp8"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = MXFP8Config

    def resolve(self, cfg: MXFP8Config, run: Any, world: World) -> Contribution:
        """Check the hardware, the model's dimensions and the micro-batch; list the converted
        and the kept linear layers; state what is kept in which dtype."""
        from olmx.plan.resolve import padded_vocab

        if cfg.scale_calculation_mode not in SCALE_MODES:
            raise ConfigError("precision.mxfp8.scale_calculation_mode",
                              f"'{cfg.scale_calculation_mode}' is not one of {', '.join(SCALE_MODES)}")
        cc = world.compute_capability
        native = world.device == "cuda" and (cc is None or cc >= MIN_COMPUTE_CAPABILITY)
        if not native and not cfg.emulate:
            need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
            raise ConfigError(
                "precision.mxfp8",
                f"MXFP8 needs an NVIDIA GPU with compute capability {need} or newer (SM100: B200, GB200, B300), whose "
                f"tensor cores multiply block-scaled FP8; found {hardware(world)}. Use precision=bf16, or set "
                f"precision.mxfp8.emulate=true to run torchao's emulated MX recipe (same numerics, slow)")
        param_dtype = resolve_param_dtype(cfg, device=world.device, parallel=run.parallel)
        if world.device == "cpu" and param_dtype == "bfloat16" and not sharded(run):
            raise ConfigError(
                "precision.mxfp8.param_dtype",
                f"bfloat16 without {' or '.join(f'parallel=[{s}]' for s in SHARDED)} means CPU autocast, which "
                f"torchao 0.15's MXLinear ignores (it follows CUDA autocast only), so bfloat16 activations would "
                f"meet float32 weights; set precision.mxfp8.param_dtype=float32 or use fsdp")
        tokens, how = tokens_per_micro_batch(run)
        if tokens % BLOCK_SIZE:
            raise ConfigError(
                "trainer.micro_batch_size",
                f"MXFP8 quantizes the weight-gradient GEMM along the tokens of a micro-batch, which must be a "
                f"multiple of the block size {BLOCK_SIZE}: {how} = {tokens} tokens")
        if run.model.d_model % BLOCK_SIZE:
            raise ConfigError(
                "model.d_model",
                f"{run.model.d_model} is not a multiple of the MX block size {BLOCK_SIZE}; every attention and "
                f"feed-forward linear layer has d_model as a dimension, so MXFP8 could convert none of them "
                f"(use precision=bf16, or a d_model divisible by {BLOCK_SIZE})")

        converted, kept = [], {}
        for layer in model_linears(run, padded_vocab(run.data.tokenizer.vocab_size)):
            why = keep_reason(layer.name, layer.in_features, layer.out_features, exclude=cfg.exclude,
                              subclass=layer.subclass)
            if why is None:
                converted.append(layer)
            else:
                kept.setdefault(why, []).append(layer)
        if not converted:
            raise ConfigError("precision.mxfp8", "no linear layer of the model would be converted: "
                              + "; ".join(f"{_shown(v)}: {k}" for k, v in kept.items()))

        kernels = ("EMULATED: torchao quantizes and dequantizes each operand in software, then multiplies in high "
                   "precision (slow; for checking numerics)" if cfg.emulate else
                   "cuBLAS block-scaled FP8 GEMMs through OLMo-core Float8Config(ao_mx=AOMXLinearConfig("
                   "kernel_preference=auto, mxfp8_cast_kernel_choice=cuda, "
                   f"scale_calculation_mode={cfg.scale_calculation_mode}))")
        rows = [
            ("format", f"OCP MX FP8: E4M3 elements, blocks of {BLOCK_SIZE} sharing one E8M0 scale "
                       f"({cfg.scale_calculation_mode}); X, W and dY quantized per GEMM along its contraction dim"),
            ("hardware", hardware(world) + ("" if cc or world.device != "cuda" else ", checked on the worker")),
            ("kernels", kernels),
            ("MXFP8 linear layers", f"{len(converted)}: {_shown(converted)}"),
        ]
        rows += [(f"kept in {param_dtype}", f"{_shown(v)}: {k}") for k, v in kept.items()]
        rows += [(label.replace("compute", "compute outside MXFP8 layers", 1), value) for label, value
                 in resolve_mixed_precision("precision.mxfp8", param_dtype, cfg.reduce_dtype, run, world)]
        rows.append(("tokens per micro-batch", f"{tokens} ({how}), a multiple of {BLOCK_SIZE}"))
        if cfg.emulate:
            rows.append(("warning", "emulated MXFP8 is slow: use it to check numerics, not to train for speed"))
        return Contribution(rows=rows)

    def apply_train_module(self, cfg: MXFP8Config, train_module: dict[str, Any], plan: Any) -> None:
        """The non-MX parts: FSDP mixed precision or autocast, as ``bf16`` does."""
        param_dtype = resolve_param_dtype(cfg, device=plan.world.device, parallel=plan.config["parallel"])
        apply_mixed_precision(param_dtype, cfg.reduce_dtype, train_module)

    def apply_model(self, cfg: MXFP8Config, model: Any, plan: Any) -> None:
        """Convert the built model's linear layers to MXFP8 (before any parallelism)."""
        from olmx_plugins.precision.mx import apply_mxfp8

        apply_mxfp8(model, cfg, emulate=cfg.emulate)


MXFP8 = MXFP8Precision()
