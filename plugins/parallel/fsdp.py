"""Fully sharded data parallel: parameters, gradients and optimizer state sharded (FSDP2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.errors import ConfigError
from olmx.api import Contribution, World
from olmx_plugins.parallel.data_parallel import DataParallelStrategy

WRAPPING = ("full", "blocks", "fine_grained")


@dataclass
class FSDPConfig:
    """Settings of ``fsdp``."""

    #: OLMo-core wrapping strategy: ``full`` (each block and the LM head), ``blocks`` (each
    #: block; the LM head stays with the root) or ``fine_grained`` (modules inside blocks too).
    wrapping_strategy: str = "full"
    #: Blocks whose all-gather is issued ahead of use (0 = FSDP's default of one).
    prefetch_factor: int = 0


class FullyShardedStrategy(DataParallelStrategy):
    """FSDP2 through OLMo-core, with its wrapping options."""

    def resolve(self, cfg: Any, run: Any, world: World) -> Contribution:
        """Check the wrapping strategy."""
        if cfg.wrapping_strategy not in WRAPPING:
            raise ConfigError(f"parallel.{self.name}.wrapping_strategy",
                              f"'{cfg.wrapping_strategy}' is not one of {', '.join(WRAPPING)}")
        return super().resolve(cfg, run, world)

    def dp_config_kwargs(self, cfg: Any) -> dict[str, Any]:
        """Wrapping strategy and prefetch factor."""
        from olmo_core.nn.transformer.config import TransformerDataParallelWrappingStrategy

        return {"wrapping_strategy": TransformerDataParallelWrappingStrategy(cfg.wrapping_strategy),
                "prefetch_factor": cfg.prefetch_factor}


FSDP = FullyShardedStrategy(
    name="fsdp", description=__doc__.splitlines()[0], config=FSDPConfig,
    summary="parameters, gradients and optimizer state sharded",
)
