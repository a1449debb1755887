"""wandb: metrics, config and plan as a Weights & Biases run, offline (RUN_DIR/wandb) unless asked.

By default (``trackers.wandb.mode=offline``) rank 0 writes a W&B offline run into
``RUN_DIR/wandb/offline-run-*`` and sends nothing anywhere: no API key is needed, W&B's system
metrics sampling and its error reporting are off. ``wandb sync RUN_DIR/wandb/offline-run-*``
uploads it later, from wherever a key is. ``trackers.wandb.mode=online`` sends the run to the W&B
server as it trains; it needs ``WANDB_API_KEY`` in the environment (the plan refuses it without
one). The key is read by ``wandb`` from the environment only: it is never a config field, so it
is never in the printed or saved config, the plan or olmx's logs.

Through OLMo-core's ``WandBCallback`` (metrics of every logged step, the run's finish and
failure), which olmx opens in the chosen mode and folder instead of requiring a key.
Each ``olmx train`` of a run directory (a resume included) is one W&B run, named and grouped by
the run directory's name. Needs ``pip install 'olmx[wandb]'``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Optional

from olmx.api import Context, Contribution, TrackerPlugin, require_package, setting
from olmx.errors import ConfigError
from olmx_plugins.trackers.common import check_dir, tracker_dir


class Mode(StrEnum):
    """``trackers.wandb.mode`` values."""

    offline = "offline"
    online = "online"


#: The environment variable ``wandb`` reads its API key from (online mode).
KEY_ENV = "WANDB_API_KEY"
#: The W&B server ``wandb`` talks to when neither ``base_url`` nor ``WANDB_BASE_URL`` says otherwise.
DEFAULT_BASE_URL = "https://api.wandb.ai"


@dataclass(frozen=True)
class WandBConfig:
    """Settings of ``trackers.wandb``."""

    #: ``offline`` (the default: the run is written under ``dir`` and nothing is sent; upload it
    #: later with ``wandb sync``) or ``online`` (sent to the W&B server while training; needs
    #: ``WANDB_API_KEY`` in the environment of the launch and of the processes that train, never
    #: in the config).
    mode: Mode = setting(Mode.offline)
    #: W&B project.
    project: str = "olmx"
    #: W&B entity (user or team); null: the API key's default entity.
    entity: Optional[str] = None
    #: Run name; null: the run directory's name.
    name: Optional[str] = None
    #: Run group; null: the run directory's name (so the attempts of a resumed run are grouped).
    group: Optional[str] = None
    #: Tags of the run.
    tags: list[str] = field(default_factory=list)
    #: A note on the run.
    notes: Optional[str] = None
    #: Folder ``wandb`` puts its ``wandb/`` folder (offline runs, logs) in: a relative path is
    #: inside the run directory (the default ``.``: ``RUN_DIR/wandb/``), an absolute one is used
    #: as it is.
    dir: str = "."
    #: W&B server of online mode (``https://...``); null: ``$WANDB_BASE_URL``, else
    #: ``https://api.wandb.ai``. Unused offline.
    base_url: Optional[str] = None


class WandB(TrackerPlugin):
    """Every metric, the resolved config and the plan as a W&B run, offline unless asked."""

    name = "wandb"
    api = ">=3.0,<4"
    Config = WandBConfig

    def resolve(self, cfg: WandBConfig, ctx: Context) -> Contribution:
        """Check the mode (online: the key is in the environment), the folder and the server;
        say where the data goes."""
        shown = check_dir(cfg.dir, field=f"{self.section}.dir")
        if cfg.base_url is not None and not cfg.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.section}.base_url", f"'{cfg.base_url}' is not an http:// or https:// URL")
        require_package("wandb", extra="wandb", field=self.section)
        runs = f"{shown}/wandb/offline-run-*"
        project = f"project {cfg.project}" + (f", entity {cfg.entity}" if cfg.entity else "")
        if cfg.mode == "offline":
            return Contribution(
                rows=[
                    ("writes", f"offline: {runs} ({project}); nothing is sent"),
                    ("upload later", f"wandb sync {runs}"),
                ]
            )
        if KEY_ENV not in os.environ:
            raise ConfigError(
                f"{self.section}.mode",
                f"online needs {KEY_ENV} in the environment, and it is not set; set it (never in the config), "
                f"or keep {self.section}.mode=offline, which needs no key and sends nothing",
            )
        return Contribution(rows=[("sends", f"online: {server(cfg)} ({project}); also written to {shown}/wandb")])

    def callbacks(self, cfg: WandBConfig, plan: Any) -> dict[str, Any]:
        """OLMo-core's W&B callback, opened in ``cfg.mode`` (the core adds it on rank 0)."""
        from olmx_plugins.trackers.wandb.callback import OlmxWandBCallback

        label = Path(plan.run_dir).name
        return {
            "wandb": OlmxWandBCallback(
                mode=cfg.mode,
                dir=str(tracker_dir(plan.run_dir, cfg.dir)),
                base_url=server(cfg) if cfg.mode == "online" else None,
                name=cfg.name or label,
                group=cfg.group or label,
                project=cfg.project,
                entity=cfg.entity,
                tags=list(cfg.tags) or None,
                notes=cfg.notes,
                config=plan.to_dict(),
                # OLMo-core checks the run's tags on the server for a cancel request; olmx's own
                # guard stops runs (every rank agrees on the step), so that check stays off.
                cancel_tags=None,
            )
        }


def server(cfg: WandBConfig) -> str:
    """The W&B server online mode sends to."""
    return cfg.base_url or os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL


#: The plugin object the entry point names.
WANDB = WandB()
