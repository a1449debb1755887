"""Fully sharded data parallel: parameters, gradients and optimizer state sharded (FSDP2)."""

from __future__ import annotations

from olmx_plugins.parallel.data_parallel import FSDPConfig, FullyShardedStrategy

FSDP = FullyShardedStrategy(
    name="fsdp",
    config=FSDPConfig,
    summary="parameters, gradients and optimizer state sharded",
)
