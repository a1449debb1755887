"""Shared machinery of the data-parallel strategies (``ddp``, ``fsdp``; ``hsdp`` builds on it).

Each strategy fills OLMo-core's ``TransformerDataParallelConfig`` (the train module's
``dp_config``); the device mesh is OLMo-core's. Precision plugins run after the parallel
ones and set the config's parameter / reduce dtypes.
"""

from __future__ import annotations

from typing import Any

from olmx.api import Contribution, World


class DataParallelStrategy:
    """A data-parallel strategy backed by OLMo-core's ``TransformerDataParallelConfig``."""

    api = ">=1.0,<2"

    def __init__(self, *, name: str, description: str, config: type, summary: str,
                 dp_type: str | None = None) -> None:
        self.name = name
        self._dp_type = dp_type or name
        self.description = description
        self.Config = config
        self._summary = summary

    def resolve(self, cfg: Any, run: Any, world: World) -> Contribution:
        """Check this strategy's own settings (the mesh comes from :meth:`dp_mesh`)."""
        return Contribution(rows=[("layout", self._summary)], data_parallel=True)

    def dp_mesh(self, cfg: Any, dp_ranks: int, world: World) -> dict[str, int]:
        """Mesh dimensions of the ``dp_ranks`` data-parallel ranks (those not taken by
        context or other non-data-parallel degrees)."""
        return {"dp": dp_ranks}

    def dp_config_kwargs(self, cfg: Any) -> dict[str, Any]:
        """Keyword arguments of ``TransformerDataParallelConfig`` beyond ``name``."""
        return {}

    def apply_train_module(self, cfg: Any, train_module: dict[str, Any], plan: Any) -> None:
        """Set ``dp_config``."""
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerDataParallelConfig

        train_module["dp_config"] = TransformerDataParallelConfig(
            name=DataParallelType(self._dp_type), **self.dp_config_kwargs(cfg)
        )
