"""Resuming a run directory: whether its checkpoint's config allows it, and what changes.

A checkpoint can only be resumed by the run it was trained with: the same model (its shape and
the layers in it) and the same data (the order of the batches). :func:`check_resume` compares
the run directory's saved plan with the new run when resolve finds a checkpoint, so that
``olmx train`` and ``--dry-run`` alike refuse a mismatch before anything is written;
:func:`resume_notes` says what a resume does change.
"""

from __future__ import annotations

from typing import Any

from olmx.errors import ConfigError
from olmx.plan.codec import run_to_data, saved_config
from olmx.rundir import RunDir

#: Sections of the config a checkpoint was trained with that must match to resume from it
#: (the model's shape and the layers in it, the data and its order), and keys of them that may
#: change (they do not change what is trained; ``model.init_from`` only seeds a fresh start).
RESUME_SECTIONS = ("model", "data", "layers")
RESUME_FREE_KEYS = ("data.cache_dir", "data.num_workers", "model.init_from")


def config_differences(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key of :data:`RESUME_SECTIONS` whose value differs between
    two plain run configs (keys one side does not have are a schema change, not a difference;
    a layer added or removed is one)."""

    def flat(value: Any, prefix: str) -> dict[str, Any]:
        if isinstance(value, dict):
            items: dict[str, Any] = {}
            for k, v in value.items():
                items.update(flat(v, f"{prefix}.{k}"))
            return items
        return {prefix: value}

    out = []
    for section in RESUME_SECTIONS:
        old, cur = saved.get(section) or {}, new.get(section) or {}
        if section == "layers" and set(old) != set(cur):
            out.append(f"layers: [{','.join(old)}] -> [{','.join(cur)}]")
            continue
        a, b = flat(old, section), flat(cur, section)
        for key in sorted(a.keys() & b.keys()):
            if a[key] != b[key] and key not in RESUME_FREE_KEYS:
                out.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    held = [_held_out(config) for config in (saved, new)]
    if held[0] != held[1]:  # the held-out slice is cut from the training data: it changes the batches
        settings = "eval.interval, eval.data, eval.holdout_sequences"
        out.append(f"sequences held out of the training data for evaluation ({settings}): {held[0]} -> {held[1]}")
    return out


def _held_out(config: dict[str, Any]) -> int:
    """Sequences a plain run config holds out of its training data (none before ``eval`` existed)."""
    from olmx.data.splits import held_out_sequences

    e = config.get("eval") or {}
    return held_out_sequences(e.get("interval"), e.get("data") or [], e.get("holdout_sequences", 0))


def check_resume(run: Any, run_dir: str, resume_step: int) -> None:
    """:class:`ConfigError` (``trainer.resume``) when the model, layers or data of ``run_dir``'s
    saved plan differ from ``run``'s (the checkpoint could not be loaded, or would be trained
    on other data)."""
    saved = saved_config(RunDir(run_dir).plan)
    if saved is None:
        return
    differences = config_differences(saved, run_to_data(run))
    if differences:
        raise ConfigError(
            "trainer.resume",
            f"the checkpoint at step {resume_step} in {run_dir} was trained with another config "
            f"({'; '.join(differences)}). Resume with the same settings, start this directory over with "
            f"trainer.resume=false (its checkpoints are moved aside, not deleted), or choose a new trainer.run_dir",
        )


def resume_notes(plan: Any) -> list[str]:
    """Lines to print about what a resume changes (``trainer.max_steps``: the schedule)."""
    saved = saved_config(RunDir(plan.run_dir).plan)
    t = plan.run.trainer
    old_max = ((saved or {}).get("trainer") or {}).get("max_steps")
    if old_max is None or old_max == t.max_steps:
        return []
    return [
        f"trainer.max_steps {old_max} -> {t.max_steps}: the learning-rate schedule ({t.schedule}, "
        f"{t.warmup_steps} warm-up steps) is rebuilt for {t.max_steps} steps and continues at step "
        f"{plan.resume_step + 1} where the new schedule is; the steps already trained are not replayed"
    ]
