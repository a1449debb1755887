"""bfloat16 compute with float32 master weights and float32 gradient reduction.

Two mechanisms, chosen by the data-parallel strategy, so that the optimizer always updates
float32 master weights (pure bf16 parameters lose small updates: research note
ulysses-mxfp8-bf16.md §6):

* ``fsdp`` / ``hsdp``: OLMo-core's ``dp_config.param_dtype`` / ``reduce_dtype``, i.e. FSDP2's
  ``MixedPrecisionPolicy``. The sharded parameters (master weights), their gradients and the
  optimizer state stay float32; each block's parameters are all-gathered in ``param_dtype``
  and its gradients reduce-scattered in ``reduce_dtype``.
* ``ddp`` or one process: ``torch.autocast`` over float32 parameters (OLMo-core's
  ``autocast_precision``). OLMo-core's DDP ``param_dtype`` would cast the whole model, master
  weights included, so it is not used; DDP all-reduces the float32 gradients, which is why
  ``reduce_dtype`` can only be float32 there.

On CPUs without bf16 units (AVX2 only) bf16 is several times slower than fp32
(benchmarks/results/precision.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.errors import ConfigError
from olmx.api import Contribution, World

DTYPES = ("bfloat16", "float32")
#: Data-parallel strategies that shard parameters (and so have a mixed-precision policy).
SHARDED = ("fsdp", "hsdp")


@dataclass
class BF16Config:
    """Settings of ``bf16``."""

    #: dtype of the parameters as compute uses them: under fsdp/hsdp the dtype FSDP
    #: all-gathers the float32 master shards into; elsewhere the torch.autocast dtype
    #: (float32 turns autocast off). Master weights are always float32.
    param_dtype: str = "bfloat16"
    #: dtype in which gradients are reduced across ranks (fsdp/hsdp). ddp reduces the float32
    #: gradients of its float32 parameters, so only float32 is possible there.
    reduce_dtype: str = "float32"


def sharded(run: Any) -> bool:
    """Whether the run's data parallelism shards parameters (fsdp/hsdp)."""
    return any(name in SHARDED for name in run.parallel)


def resolve_mixed_precision(prefix: str, param_dtype: str, reduce_dtype: str, run: Any,
                            world: World) -> list[tuple[str, str]]:
    """Check ``param_dtype`` / ``reduce_dtype`` (config keys under ``prefix``) against the
    run's parallelism; return the plan rows saying what is kept in which dtype."""
    for key, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if value not in DTYPES:
            raise ConfigError(f"{prefix}.{key}", f"'{value}' is not one of {', '.join(DTYPES)}")
    rows = [("master weights, optimizer state", "float32")]
    if sharded(run):
        return rows + [
            ("compute (all-gathered parameters)", param_dtype),
            ("gradient reduction (reduce-scatter)", reduce_dtype),
            ("gradients the optimizer sees", "float32 (sharded)"),
            ("mechanism", f"OLMo-core dp_config.param_dtype={param_dtype}, reduce_dtype={reduce_dtype} "
                          "(FSDP2 mixed-precision policy)"),
        ]
    if world.size > 1 and reduce_dtype != "float32":
        raise ConfigError(f"{prefix}.reduce_dtype",
                          f"{reduce_dtype} reduction needs parallel=[fsdp] or [hsdp]: without sharding the "
                          f"parameters stay float32 and DDP all-reduces their float32 gradients")
    if param_dtype == "float32":
        rows.append(("compute", "float32 (no autocast)"))
    else:
        rows.append(("compute", "bfloat16 for autocast's lower-precision ops (linear, matmul, attention); "
                                "the rest as torch.autocast's op lists say"))
    rows.append(("gradients, reduction", "float32" if world.size > 1 else "float32 (one process: no reduction)"))
    rows.append(("mechanism", "OLMo-core autocast_precision=bfloat16 (torch.autocast)" if param_dtype != "float32"
                 else "none"))
    return rows


def apply_mixed_precision(param_dtype: str, reduce_dtype: str, train_module: dict[str, Any]) -> None:
    """Set the mixed-precision policy of a sharded ``dp_config``, or autocast elsewhere."""
    from olmo_core.config import DType

    dp = train_module.get("dp_config")
    if dp is not None and str(dp.name) in SHARDED:
        dp.param_dtype = DType(param_dtype)
        dp.reduce_dtype = DType(reduce_dtype)
    elif param_dtype != "float32":
        train_module["autocast_precision"] = DType(param_dtype)


class BF16Precision:
    """Maps bf16 onto OLMo-core's data-parallel mixed precision or autocast."""

    name = "bf16"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = BF16Config

    def resolve(self, cfg: BF16Config, run: Any, world: World) -> Contribution:
        """Check dtypes; state where each tensor lives in which dtype."""
        rows = resolve_mixed_precision("precision.bf16", cfg.param_dtype, cfg.reduce_dtype, run, world)
        if world.device == "cpu" and cfg.param_dtype == "bfloat16":
            rows.append(("note", "most CPUs have no bf16 units: slower than fp32 there"))
        return Contribution(rows=rows)

    def apply_train_module(self, cfg: BF16Config, train_module: dict[str, Any], plan: Any) -> None:
        """Mixed-precision policy under FSDP/HSDP, autocast elsewhere."""
        apply_mixed_precision(cfg.param_dtype, cfg.reduce_dtype, train_module)


BF16 = BF16Precision()
