"""The tensorboard tracker's OLMo-core callback (rank 0 only: the core adds it there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from olmo_core.train.callbacks import Callback

from olmx.metrics import canonical


@dataclass
class TensorBoardCallback(Callback):
    """Writes every logged metric as a scalar at its step, and the config and plan as text."""

    #: Folder of the event files.
    log_dir: str = ""
    #: Steps from this one on that earlier event files recorded are dropped by the reader.
    purge_step: int = 1
    #: Seconds between writes of pending events.
    flush_secs: int = 30
    #: Tag -> Markdown text, written once at ``text_step``.
    texts: dict[str, str] = field(default_factory=dict)
    #: The step this attempt starts from.
    text_step: int = 0
    _writer: Any = field(default=None, repr=False)

    def pre_train(self) -> None:
        """Open a new event file (purging what earlier ones logged from ``purge_step`` on) and write the texts."""
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=self.purge_step, flush_secs=self.flush_secs)
        for tag, text in self.texts.items():
            self._writer.add_text(tag, text, global_step=self.text_step)
        self._writer.flush()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Every numeric metric of the step under the run's name (:func:`olmx.metrics.canonical`:
        ``metrics.jsonl``'s)."""
        if self._writer is None:
            return
        for name, value in canonical(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)

    def post_train(self) -> None:
        """Write what is pending (the trainer also calls this when it stops early)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write what is pending and close the event file (also after an error)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
