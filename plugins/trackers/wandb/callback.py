"""The wandb tracker's OLMo-core callback (rank 0 only: the core adds it there)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from olmo_core.train.callbacks.wandb import WandBCallback

from olmx.metrics import canonical


@dataclass
class OlmxWandBCallback(WandBCallback):
    """OLMo-core's ``WandBCallback`` (metrics of every logged step under the run's names, finish, failure) opened in a
    chosen mode and folder: OLMo-core's own ``pre_train`` requires ``WANDB_API_KEY`` even offline
    and leaves the mode to the environment; its ``finalize`` passes ``quiet``, which recent ``wandb``
    releases (0.31) no longer take."""

    #: ``offline`` or ``online``.
    mode: str = "offline"
    #: Folder ``wandb`` writes into.
    dir: str = ""
    #: W&B server (online mode).
    base_url: Optional[str] = None

    def pre_train(self) -> None:
        """Open the W&B run. Offline: nothing is sent (no system metrics sampling, which probes
        cloud metadata servers; no error reporting) and no key is needed."""
        if not self.enabled:
            return
        wandb = self.wandb
        if self.mode == "offline":
            # wandb reads it when it starts its service process; offline means nothing is sent.
            os.environ["WANDB_ERROR_REPORTING"] = "false"
            settings = wandb.Settings(silent=True, x_disable_stats=True, x_disable_machine_info=True)
        else:
            settings = wandb.Settings(silent=True, base_url=self.base_url)
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        wandb.init(
            dir=self.dir,
            mode=self.mode,
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=self.name,
            tags=self.tags,
            notes=self.notes,
            config=self.config,
            settings=settings,
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Every numeric metric of the step under the run's name (:func:`olmx.metrics.canonical`:
        ``metrics.jsonl``'s)."""
        super().log_metrics(step, canonical(metrics))

    def finalize(self, exit_code: int = 0) -> None:
        """Finish the W&B run once (``exit_code`` > 0: failed)."""
        if not self.finalized:
            self.wandb.finish(exit_code=exit_code)
            self._finalized = True
