"""``trainer.max_tokens`` and ``trainer.epochs``: a run's length in tokens or passes over its
data, turned into ``trainer.max_steps`` at plan time as OLMo-core's ``Duration`` turns them into
steps (its ``Trainer.max_steps``). The rest of the plan, and the worker, see only steps."""

from __future__ import annotations

import math
from dataclasses import replace

from olmx.config.schema import RunConfig
from olmx.errors import ConfigError


def resolve_duration(run: RunConfig, *, files_here: bool) -> tuple[RunConfig, list[tuple[str, str]]]:
    """The run with ``trainer.max_steps`` derived from ``max_tokens`` or ``epochs`` (unchanged
    where neither is set), and the plan's row saying how."""
    t = run.trainer
    if t.max_tokens is not None and t.epochs is not None:
        raise ConfigError(
            "trainer.max_tokens", "set trainer.max_tokens or trainer.epochs (or neither: trainer.max_steps), not both"
        )
    step_tokens = t.global_batch_size * run.data.seq_len
    if t.max_tokens is not None:
        steps = math.ceil(t.max_tokens / step_tokens)
        how = f"trainer.max_tokens={t.max_tokens:,} / {step_tokens:,} tokens per step, rounded up"
    elif t.epochs is not None:
        sequences = _training_sequences(run, files_here=files_here)
        steps = t.epochs * sequences // t.global_batch_size
        how = (
            f"trainer.epochs={t.epochs} x {sequences:,} training sequences // trainer.global_batch_size="
            f"{t.global_batch_size}"
        )
        if steps < 1:
            raise ConfigError(
                "trainer.epochs",
                f"{how} is 0 steps: the data holds less than one optimizer step; add data or lower the batch",
            )
    else:
        return run, []
    if t.stop_at_step is not None and t.stop_at_step > steps:
        raise ConfigError("trainer.stop_at_step", f"{t.stop_at_step} is past the run's end: {how} = {steps:,} steps")
    return replace(run, trainer=replace(t, max_steps=steps)), [("duration", f"{steps:,} steps ({how})")]


def _training_sequences(run: RunConfig, *, files_here: bool) -> int:
    """Whole training sequences of the run's data (less the held-out ones), from the files'
    sizes and headers."""
    from olmx.data import splits

    if not files_here:
        raise ConfigError(
            "trainer.epochs",
            "counts the training data's sequences at plan time, but the data is not on this machine: "
            "set trainer.max_steps (or trainer.max_tokens) instead",
        )
    try:
        parts = splits.planned_split(run, splits.holdout_count(run))
    except OSError as exc:
        raise ConfigError("data.paths", f"cannot read {exc.filename or exc}: {exc.strerror or exc}") from None
    return sum(sum(s.train_tokens) // s.seq_len for s in parts)
