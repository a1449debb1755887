"""Shared machinery of the data-parallel strategies (``ddp``, ``fsdp``; ``hsdp`` builds on it).

Each strategy fills OLMo-core's ``TransformerDataParallelConfig`` (the train module's
``dp_config``); the device mesh is OLMo-core's. Precision plugins run after the parallel
ones and set the config's parameter / reduce dtypes.
"""

from __future__ import annotations

from typing import Any

from olmx.protocols import Contribution, World


class DataParallelStrategy:
    """A data-parallel strategy backed by OLMo-core's ``TransformerDataParallelConfig``."""

    api = ">=1.0,<2"

    def __init__(self, *, name: str, description: str, config: type, summary: str) -> None:
        self.name = name
        self.description = description
        self.Config = config
        self._summary = summary

    def resolve(self, cfg: Any, run: Any, world: World) -> Contribution:
        """Every process is a data-parallel rank of this strategy."""
        return Contribution(rows=[("ranks", f"{world.size}, {self._summary}")],
                            mesh={"dp": world.size}, data_parallel=True)

    def dp_config_kwargs(self, cfg: Any) -> dict[str, Any]:
        """Keyword arguments of ``TransformerDataParallelConfig`` beyond ``name``."""
        return {}

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Any) -> None:
        """Set ``dp_config``."""
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerDataParallelConfig

        train_module["dp_config"] = TransformerDataParallelConfig(
            name=DataParallelType(self.name), **self.dp_config_kwargs(cfg)
        )
