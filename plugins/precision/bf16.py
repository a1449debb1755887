"""bfloat16 compute with float32 master weights and float32 gradient reduction.

Under FSDP/HSDP this is OLMo-core's FSDP2 mixed-precision policy (parameters all-gathered in
``param_dtype``, gradients reduced in ``reduce_dtype``, sharded master weights kept in fp32);
elsewhere (DDP, one process) it is ``torch.autocast`` over float32 parameters. On CPUs without
bf16 units autocast is several times slower than fp32 (benchmarks/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.errors import ConfigError
from olmx.protocols import Contribution, World

DTYPES = ("bfloat16", "float32")
SHARDED = ("fsdp", "hsdp")


@dataclass
class BF16Config:
    """Settings of ``bf16``."""

    #: dtype in which sharded strategies all-gather parameters for compute.
    param_dtype: str = "bfloat16"
    #: dtype of gradient reduction across ranks.
    reduce_dtype: str = "float32"


class BF16Precision:
    """Maps bf16 onto OLMo-core's data-parallel mixed precision or autocast."""

    name = "bf16"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = BF16Config

    def resolve(self, cfg: BF16Config, run: Any, world: World) -> Contribution:
        """Check dtypes; state where each tensor lives in which dtype."""
        for key in ("param_dtype", "reduce_dtype"):
            if getattr(cfg, key) not in DTYPES:
                raise ConfigError(f"precision.bf16.{key}", f"'{getattr(cfg, key)}' is not one of {', '.join(DTYPES)}")
        sharded = any(p in SHARDED for p in run.parallel)
        rows = [("master weights", "float32")]
        if sharded:
            rows += [("compute (all-gathered parameters)", cfg.param_dtype),
                     ("gradient reduction", cfg.reduce_dtype), ("mechanism", "FSDP2 mixed-precision policy")]
        else:
            rows += [("compute", "bfloat16 (torch.autocast)"), ("gradient reduction", "float32"),
                     ("mechanism", "autocast")]
        if world.device == "cpu":
            rows.append(("note", "bf16 on CPU is emulated by most CPUs and slower than fp32"))
        return Contribution(rows=rows)

    def apply_train_module(self, cfg: BF16Config, train_module: dict[str, Any], plan: Any) -> None:
        """Mixed-precision policy under FSDP/HSDP, autocast elsewhere."""
        from olmo_core.config import DType

        dp = train_module.get("dp_config")
        if dp is not None and str(dp.name) in SHARDED:
            dp.param_dtype = DType(cfg.param_dtype)
            dp.reduce_dtype = DType(cfg.reduce_dtype)
        else:
            train_module["autocast_precision"] = DType.bfloat16


BF16 = BF16Precision()
