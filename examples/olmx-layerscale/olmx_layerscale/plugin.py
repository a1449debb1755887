"""LayerScale: learnable per-channel scales on the residual branches of chosen blocks (CaiT).

The layer plugin ``layerscale``: in ``apply_model`` it replaces the attention and/or
feed-forward :class:`~olmo_core.nn.residual_stream.ResidualStream` of the chosen blocks of the
built (meta-device) model with :class:`olmx_layerscale.modules.LayerScaleResidualStream`,
before olmx applies activation checkpointing, compile and data parallelism, so the scales are
materialised by OLMo-core's ``init_weights`` (through ``reset_parameters``), sharded or
replicated with their block, trained and saved in checkpoints like every other parameter
(``blocks.<i>.<branch>_residual_stream.scale``). ``apply_train_module`` puts them in an
optimizer group of their own (``weight_decay``). See :mod:`olmx_layerscale.modules` for the
method and its source.

This module imports no torch: olmx imports it to list and configure plugins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from olmx.api import Context, Contribution, LayerPlugin
from olmx.errors import ConfigError

#: Residual branches of an OLMo-core block, by the prefix of their ``*_residual_stream`` module.
BRANCHES = ("attention", "feed_forward")


@dataclass(frozen=True)
class LayerScaleConfig:
    """Settings of ``layers.layerscale``."""

    #: Initial value of every scale (CaiT: 0.1 up to 18 blocks, 1e-5 at 24, 1e-6 deeper).
    init: float = 0.1
    #: Scale every N-th block, starting at block 0 (used when ``blocks`` is null).
    every: int = 1
    #: Explicit block indices to scale; null means every ``every``-th block.
    blocks: list[int] | None = None
    #: Residual branches that get a scale: ``attention``, ``feed_forward``, or both.
    branches: list[str] = field(default_factory=lambda: list(BRANCHES))
    #: Weight decay of the scales (CaiT applies none).
    weight_decay: float = 0.0


def chosen_blocks(cfg: LayerScaleConfig, n_layers: int) -> list[int]:
    """Indices of the blocks ``cfg`` scales in a model of ``n_layers`` blocks."""
    if cfg.blocks is not None:
        return sorted(set(cfg.blocks))
    return list(range(0, n_layers, cfg.every))


def param_patterns(cfg: LayerScaleConfig) -> list[str]:
    """Parameter-name globs of the scales (the ``*`` also crosses activation-checkpoint wrappers)."""
    return [f"blocks.*{branch}_residual_stream.scale" for branch in cfg.branches]


class LayerScaleLayer(LayerPlugin):
    """The ``layerscale`` layer plugin."""

    name = "layerscale"
    api = ">=3.0,<4"
    Config = LayerScaleConfig

    def resolve(self, cfg: LayerScaleConfig, ctx: Context) -> Contribution:
        """Check the settings against the model; report the scales it adds (d_model each)."""
        n_layers, d_model = ctx.run.model.n_layers, ctx.run.model.d_model
        if not math.isfinite(cfg.init):
            raise ConfigError("layers.layerscale.init", f"must be a finite number, got {cfg.init}")
        if cfg.every < 1:
            raise ConfigError("layers.layerscale.every", f"must be a positive integer, got {cfg.every}")
        if cfg.blocks is not None:
            bad = sorted(i for i in cfg.blocks if not 0 <= i < n_layers)
            if bad:
                raise ConfigError("layers.layerscale.blocks", f"{bad} outside [0, model.n_layers={n_layers})")
            if not cfg.blocks:
                raise ConfigError("layers.layerscale.blocks", "is empty; set null to use layers.layerscale.every")
        unknown = [b for b in cfg.branches if b not in BRANCHES]
        if unknown or not cfg.branches or len(set(cfg.branches)) != len(cfg.branches):
            raise ConfigError(
                "layers.layerscale.branches", f"{list(cfg.branches)} must be distinct names among {', '.join(BRANCHES)}"
            )
        if cfg.weight_decay < 0:
            raise ConfigError("layers.layerscale.weight_decay", f"must be >= 0, got {cfg.weight_decay}")
        blocks = chosen_blocks(cfg, n_layers)
        params = len(blocks) * len(cfg.branches) * d_model
        how = "chosen" if cfg.blocks is not None else f"every {cfg.every}"
        return Contribution(
            rows=[
                ("blocks", f"{', '.join(map(str, blocks))} ({how}, of {n_layers})"),
                ("branches", ", ".join(cfg.branches)),
                ("init", f"{cfg.init:g}, weight decay {cfg.weight_decay:g}"),
                ("parameters", f"{params:,} = {len(blocks)} blocks x {len(cfg.branches)} branches x d_model {d_model}"),
            ],
            params=params,
            active_params=params,
        )

    def apply_model_config(self, cfg: LayerScaleConfig, model_config: Any, plan: Any) -> Any:
        """The model config is unchanged: LayerScale edits the built model."""
        return model_config

    def apply_model(self, cfg: LayerScaleConfig, model: Any, plan: Any) -> None:
        """Replace the residual streams of the chosen blocks by LayerScale streams (in place,
        before activation checkpointing, compile and data parallelism)."""
        from olmo_core.nn.residual_stream import ResidualStream

        from olmx_layerscale.modules import LayerScaleResidualStream

        for index in chosen_blocks(cfg, len(model.blocks)):
            block = model.blocks[str(index)]
            for branch in cfg.branches:
                stream = getattr(block, f"{branch}_residual_stream", None)
                if not isinstance(stream, ResidualStream) or isinstance(stream, LayerScaleResidualStream):
                    raise ConfigError(
                        "layers.layerscale",
                        f"block {index} ({type(block).__name__}) has no plain {branch} residual stream to scale",
                    )
                device = next(block.parameters()).device
                setattr(
                    block,
                    f"{branch}_residual_stream",
                    LayerScaleResidualStream.replacing(stream, block.d_model, init=cfg.init, device=device),
                )

    def apply_train_module(
        self, cfg: LayerScaleConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]
    ) -> Any:
        """Give the scales an optimizer group of their own with ``weight_decay``."""
        from olmo_core.optim import OptimGroupOverride

        optim = train_module.optim
        overrides = list(optim.group_overrides or [])
        overrides.append(OptimGroupOverride(params=param_patterns(cfg), opts={"weight_decay": cfg.weight_decay}))
        optim.group_overrides = overrides
        return train_module


#: The plugin object the entry point names.
LAYERSCALE = LayerScaleLayer()
