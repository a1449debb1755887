"""tensorboard: metrics, config and plan as TensorBoard event files (RUN_DIR/tensorboard), nothing sent.

Rank 0 writes with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package,
``pip install 'olmx[tensorboard]'``): each scalar the trainer logs at its step, under the
trainer's own name (``train/CE loss``, ``optim/LR (group 0)``, ...), and two text entries at the
step the attempt starts from, ``olmx/config`` (the resolved config as YAML) and ``olmx/plan``
(the printed plan). Nothing leaves the machine; view with ``tensorboard --logdir RUN_DIR/tensorboard``.

Every attempt of a run adds a new event file to the same folder and never rewrites an earlier
one. It starts with ``purge_step`` = the step it resumes from + 1 (1 for a fresh start): the
reader then drops what earlier files recorded at that step and later (TensorBoard's
``SessionLog.START`` purge, what ``SummaryWriter(purge_step=...)`` is for), so steps that a
stopped attempt logged after its last checkpoint, and the steps of a run started over with
``trainer.resume=false``, are not shown twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmx.api import Context, Contribution, TrackerPlugin, require_package, setting
from olmx_plugins.trackers.common import check_dir, plan_markdown, tracker_dir


@dataclass(frozen=True)
class TensorBoardConfig:
    """Settings of ``trackers.tensorboard``."""

    #: Folder of the event files: a relative path is inside the run directory (the default:
    #: ``RUN_DIR/tensorboard``); an absolute one is shared by runs, each writing into its own
    #: ``DIR/<run directory's name>`` (``tensorboard --logdir DIR`` compares them). olmx adds
    #: event files there and removes none.
    dir: str = "tensorboard"
    #: Seconds between writes of pending events to disk while training (``SummaryWriter``'s
    #: ``flush_secs``); everything is written when training ends, however it ends.
    flush_secs: int = setting(30, ge=1)


class TensorBoard(TrackerPlugin):
    """Every metric, the resolved config and the plan as TensorBoard event files; nothing is sent."""

    name = "tensorboard"
    api = ">=3.0,<4"
    Config = TensorBoardConfig

    def resolve(self, cfg: TensorBoardConfig, ctx: Context) -> Contribution:
        """Check the folder and the flush interval and that ``tensorboard`` is installed; say where it writes."""
        shown = check_dir(cfg.dir, field=f"{self.section}.dir")
        if Path(cfg.dir).is_absolute():
            shown = f"{shown}/<run directory's name>"
        require_package("tensorboard", extra="tensorboard", field=self.section)
        return Contribution(
            rows=[("writes", f"offline: {shown} (every metric, the config and the plan; tensorboard --logdir)")]
        )

    def callbacks(self, cfg: TensorBoardConfig, plan: Any) -> dict[str, Any]:
        """The callback that writes the event files (the core adds it on rank 0)."""
        from olmx_plugins.trackers.tensorboard.callback import TensorBoardCallback

        start = plan.resume_step or 0
        return {
            "tensorboard": TensorBoardCallback(
                log_dir=str(log_dir(plan.run_dir, cfg.dir)),
                purge_step=start + 1,
                flush_secs=cfg.flush_secs,
                texts=texts(plan),
                text_step=start,
            )
        }


def log_dir(run_dir: str, value: str) -> Path:
    """The run's event-file folder: ``RUN_DIR/value``, or ``value/<run name>`` for an absolute
    ``value`` (TensorBoard reads one folder as one run, and a run's purges apply to its folder)."""
    if Path(value).is_absolute():
        return Path(value) / Path(run_dir).name
    return tracker_dir(run_dir, value)


def texts(plan: Any) -> dict[str, str]:
    """``olmx/config`` and ``olmx/plan`` as TensorBoard text (Markdown): the resolved config as
    YAML (a code block), the plan as the table ``olmx train`` prints."""
    config = "\n".join(f"    {line}" for line in plan.config_yaml().splitlines())
    return {"olmx/config": config, "olmx/plan": plan_markdown(plan)}


#: The plugin object the entry point names.
TENSORBOARD = TensorBoard()
