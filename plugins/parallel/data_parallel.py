"""Shared machinery of the data-parallel strategies (``ddp``, ``ddp_ep``, ``fsdp``, ``hsdp``).

The distributed optimizer of ``ddp`` and ``ddp_ep`` (ZeRO-2) is FSDP2 kept gathered from the
forward to the backward: :func:`keep_gathered_callback`.

Each strategy lays out the data-parallel ranks (:meth:`olmx.api.ParallelPlugin.layout`) and
fills OLMo-core's ``TransformerDataParallelConfig`` (the train module's ``dp_config``); the
device mesh is OLMo-core's. The core sets the config's parameter / reduce dtypes from the
plan's dtypes after the parallel plugins ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from olmx.api import Context, Contribution, Layout, ParallelPlugin, World, setting


class DataParallelStrategy(ParallelPlugin):
    """A data-parallel strategy backed by OLMo-core's ``TransformerDataParallelConfig``."""

    api = ">=3.0,<4"
    data_parallel = True
    provides = ("replicate",)

    def __init__(self, *, name: str, config: type, summary: str, dp_type: str | None = None) -> None:
        self.name = name
        self._dp_type = dp_type or name
        self.Config = config
        self._summary = summary

    def layout(self, cfg: Any, dp_ranks: int, world: World) -> Layout:
        """Full replicas on every data-parallel rank."""
        return Layout(replicate=dp_ranks)

    def resolve(self, cfg: Any, ctx: Context) -> Contribution:
        """The layout in words."""
        return Contribution(rows=[("layout", self._summary)])

    def dp_config_kwargs(self, cfg: Any, plan: Any) -> dict[str, Any]:
        """Keyword arguments of ``TransformerDataParallelConfig`` beyond ``name``."""
        return {}

    def apply_train_module(self, cfg: Any, train_module: Any, plan: Any, param_names: tuple[str, ...]) -> Any:
        """Set ``dp_config``."""
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerDataParallelConfig

        train_module.dp_config = TransformerDataParallelConfig(
            name=DataParallelType(self._dp_type), **self.dp_config_kwargs(cfg, plan)
        )
        return train_module


def keep_gathered_callback() -> Any:
    """An OLMo-core callback that, before the first step, turns ``reshard_after_forward`` off on
    every FSDP2 module of the wrapped model (OLMo-core 3.0.0's ``apply_fsdp`` turns it on for
    the blocks and offers no setting)."""
    from olmo_core.train.callbacks import Callback
    from torch.distributed.fsdp import FSDPModule

    class KeepGathered(Callback):
        def pre_train(self) -> None:
            module = self.trainer.train_module
            for part in getattr(module, "model_parts", None) or [module.model]:  # a pipeline's stages
                for sub in part.modules():
                    if isinstance(sub, FSDPModule):
                        sub.set_reshard_after_forward(False, recurse=False)

    return KeepGathered()


class ReplicatedStrategy(DataParallelStrategy):
    """``ddp`` and ``ddp_ep``: OLMo-core's DDP, or with the config's ``distributed_optimizer``
    its FSDP2 config kept gathered from the forward to the backward (ZeRO-2)."""

    def apply_train_module(self, cfg: Any, train_module: Any, plan: Any, param_names: tuple[str, ...]) -> Any:
        """OLMo-core's ``ddp`` config, or its ``fsdp`` config for the distributed optimizer."""
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerDataParallelConfig

        dp_type = DataParallelType.fsdp if cfg.distributed_optimizer else DataParallelType.ddp
        train_module.dp_config = TransformerDataParallelConfig(name=dp_type)
        return train_module

    def callbacks(self, cfg: Any, plan: Any) -> dict[str, Any]:
        """For the distributed optimizer: the callback that keeps parameters gathered."""
        return {"olmx_zero2": keep_gathered_callback()} if cfg.distributed_optimizer else {}


class Wrapping(StrEnum):
    """Values of ``wrapping_strategy`` (OLMo-core's ``TransformerDataParallelWrappingStrategy``)."""

    full = "full"
    blocks = "blocks"
    fine_grained = "fine_grained"


@dataclass(frozen=True)
class FSDPConfig:
    """Settings of ``fsdp``."""

    #: OLMo-core wrapping strategy: ``full`` (each block and the LM head), ``blocks`` (each
    #: block; the LM head stays with the root) or ``fine_grained`` (modules inside blocks too).
    wrapping_strategy: Wrapping = setting(Wrapping.full)
    #: Blocks whose all-gather is issued ahead of use (0 = FSDP's default of one).
    prefetch_factor: int = setting(0, ge=0)


class FullyShardedStrategy(DataParallelStrategy):
    """FSDP2 through OLMo-core, with its wrapping options."""

    provides = ("shard",)

    def layout(self, cfg: Any, dp_ranks: int, world: World) -> Layout:
        """Every parameter sharded over all data-parallel ranks."""
        return Layout(replicate=1, shard=dp_ranks, shards_params=True)

    def dp_config_kwargs(self, cfg: Any, plan: Any) -> dict[str, Any]:
        """Wrapping strategy and prefetch factor."""
        from olmo_core.nn.transformer.config import TransformerDataParallelWrappingStrategy

        return {
            "wrapping_strategy": TransformerDataParallelWrappingStrategy(cfg.wrapping_strategy),
            "prefetch_factor": cfg.prefetch_factor,
        }
