"""Distributed data parallel: replicated parameters, gradients all-reduced (OLMo-core DDP)."""

from __future__ import annotations

from dataclasses import dataclass

from olmx_plugins.parallel.data_parallel import DataParallelStrategy


@dataclass
class DDPConfig:
    """``ddp`` has no settings of its own: every process holds a full replica."""


DDP = DataParallelStrategy(
    name="ddp",
    description=__doc__.splitlines()[0],
    config=DDPConfig,
    summary="full replicas, gradients all-reduced",
)
