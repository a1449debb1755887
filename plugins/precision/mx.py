"""The torch side of ``mxfp8``: convert a built model's linear layers (method and sources in
:mod:`olmx_plugins.precision.mxfp8`).

Both paths start from one OLMo-core ``AOMXLinearConfig`` and one module list:

* SM100+: OLMo-core's ``Transformer.apply_fp8(Float8Config(ao_mx=..., modules_to_ignore=...))``,
  the call ``parallelize_model`` makes for ``float8_config``. ``kernel_preference=auto`` is set
  explicitly: OLMo-core's ``AOMXLinearConfig.mxfp8_cublas_rceil()`` preset leaves it unset,
  and torchao's default is the emulated kernel.
* emulation: torchao's ``quantize_`` with the same config, ``kernel_preference=emulated`` and
  the torch dim-1 cast, because OLMo-core raises below SM100.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from olmx.errors import ConfigError
from olmx_plugins.precision.lowp import BLOCK_SIZE, MIN_COMPUTE_CAPABILITY, MXFP8Config

log = logging.getLogger(__name__)


def ao_mx_config(cfg: MXFP8Config, *, emulate: bool) -> Any:
    """OLMo-core's ``AOMXLinearConfig`` for ``cfg``: E4M3 elements, blocks of 32, the configured
    scale rule; real kernels, or torchao's emulation."""
    from olmo_core.config import DType
    from olmo_core.float8 import AOMXLinearConfig
    from olmo_core.float8.ao import AOKernelPreference, AOMXFP8Dim1CastKernelChoice, AOScaleCalculationMode

    return AOMXLinearConfig(
        block_size=BLOCK_SIZE,
        elem_dtype=DType.float8_e4m3fn,
        kernel_preference=AOKernelPreference.emulated if emulate else AOKernelPreference.auto,
        # Not torchao's "cuda" cast: torchao 0.15 loads its C++ extensions only under torch
        # 2.9.1/2.10, so under torch 2.13 that op has no CUDA kernel; Triton's is the fast one.
        mxfp8_cast_kernel_choice=AOMXFP8Dim1CastKernelChoice.torch if emulate else AOMXFP8Dim1CastKernelChoice.triton,
        scale_calculation_mode=AOScaleCalculationMode(cfg.scale_calculation_mode),
    )


def apply_mxfp8(model: nn.Module, cfg: MXFP8Config, *, convert: list[str], emulate: bool) -> list[str]:
    """Swap the ``nn.Linear`` modules of ``model`` named in ``convert`` (the plan's list; meta or
    materialised, before any parallelism) for torchao ``MXLinear``; return their names, checked
    against ``convert``. Parameter names do not change, so checkpoints stay interchangeable with
    bf16/fp32 runs."""
    from torchao.prototype.mx_formats.mx_linear import MXLinear

    wanted = set(convert)
    kept = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in wanted)
    ao = ao_mx_config(cfg, emulate=emulate)
    if emulate:
        from torchao.quantization import quantize_

        log.warning(
            "precision=mxfp8 with emulate=true: torchao's emulated MX recipe is slow; it is for checking "
            "numerics, not for speed"
        )
        quantize_(model, ao.to_ao_type(), filter_fn=lambda module, fqn: fqn in wanted)
    else:
        if torch.cuda.is_available() and torch.cuda.get_device_capability() < MIN_COMPUTE_CAPABILITY:
            need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
            raise ConfigError(
                "precision",
                f"this worker's GPU {torch.cuda.get_device_name()} has compute "
                f"capability {torch.cuda.get_device_capability()}, MXFP8 needs {need}+; "
                f"set precision.emulate=true to emulate",
            )
        from olmo_core.float8 import Float8Config

        model.apply_fp8(Float8Config(ao_mx=ao, modules_to_ignore=kept))
    done = sorted(n for n, m in model.named_modules() if isinstance(m, MXLinear))
    if done != sorted(convert):
        raise RuntimeError(f"MXFP8 conversion mismatch: converted {done}, planned {sorted(convert)}")
    log.info(
        "MXFP8 (%s): %d linear layers converted: %s; kept in high precision: %s (the plan says why)",
        "emulated" if emulate else "SM100",
        len(done),
        ", ".join(done),
        ", ".join(kept),
    )
    return done
