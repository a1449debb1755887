"""The torch-free rules of ``mxfp8`` (method and sources in :mod:`olmx_plugins.precision.mxfp8`):
its settings, the MX block size and which linear layers stay in high precision. Shared by the
plan (:mod:`.mxfp8`) and the conversion of the built model (:mod:`.mx`)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

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


def keep_reason(
    name: str, in_features: int, out_features: int, *, exclude: list[str] | tuple[str, ...] = (), subclass: bool = False
) -> str | None:
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
    bad = [f"{key}={n}" for key, n in (("in_features", in_features), ("out_features", out_features)) if n % BLOCK_SIZE]
    if bad:
        return f"{', '.join(bad)} not a multiple of the MX block size {BLOCK_SIZE}"
    return None
