"""A recipe's own layout beside ``parallel=auto``'s choice: the plan's ``auto`` rows ``source's
layout`` and ``auto's layout``, each with its estimated peak memory per process and step time.

A recipe (``experiment=olmo3_7b``) names the layout of the script it reproduces
(``recipe.layout``: OLMo-core's HSDP and its settings; the rank micro-batch is the recipe's
``trainer.micro_batch_size``). When the user asks ``parallel=auto`` instead, the plan composes
the same overrides without the user's layout, so with the recipe's, and
estimates both the way it estimates any run (:func:`olmx.plan.resolve.estimate_run`, the
throughput model), so a user sees whether auto's choice is cheaper, and by how much, before
launching anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from olmx.config.schema import RunConfig
from olmx.errors import ConfigError
from olmx.plan import Plan
from olmx.plan.memory import gib, usable_gib
from olmx.types import World

if TYPE_CHECKING:
    from olmx.registry import Registry

#: ``(estimated peak bytes per process, seconds per step or None)`` of a run on the plan's world;
#: ConfigError where the plan refuses it (the plan passes :func:`olmx.plan.resolve.run_cost`).
Cost = Callable[[RunConfig], tuple[int, "float | None"]]

#: Overrides that choose a layout: dropped from the user's before the recipe's layout is applied.
LAYOUT_KEYS = ("parallel", "trainer.micro_batch_size", "trainer.activation_checkpointing", "trainer.auto_micro_batch")


def follows_recipe_layout(run: RunConfig) -> bool:
    """Whether ``run`` has every setting of its recipe's ``recipe.layout`` (``parallel=[hsdp]``:
    exactly those strategies; ``parallel.hsdp.shard_degree=64``, ``trainer.micro_batch_size=2``:
    those values); False without a recipe layout."""
    import yaml

    if not run.recipe.layout:
        return False
    for override in run.recipe.layout:
        key, _, text = override.lstrip("+").partition("=")
        want = yaml.safe_load(text)
        have: object = run
        for part in key.strip().split("."):
            have = have.get(part) if isinstance(have, dict) else getattr(have, part, None)
        if isinstance(have, dict):
            have = sorted(have)
            want = sorted(want) if isinstance(want, list) else want
        have = getattr(have, "value", have)  # an enum's YAML spelling
        if have != want:
            return False
    return True


def recipe_ran_here(run: RunConfig, world: World) -> str | None:
    """Where the run is its recipe's own layout on a GPU its source trains that layout on
    (``recipe.ran_on``), the sentence saying so, which the memory check gives instead of a
    refusal (:func:`olmx.plan.memory.check`); else None."""
    if world.device != "cuda" or world.device_name not in run.recipe.ran_on or not follows_recipe_layout(run):
        return None
    source = run.recipe.source or "the recipe's source"
    return (
        f"{source} trains this layout ({' '.join(run.recipe.layout)}) on {world.device_name}, which outranks "
        "the estimate (its torch.compile term was counted on CPU, not yet measured on a GPU); if a step runs out "
        "of memory, take the change above"
    )


def with_recipe_layout(plan: Plan, overrides: list[str], reg: Registry, cost: Cost) -> Plan:
    """``plan`` with its ``auto`` rows extended by the recipe's layout and auto's, where the
    run chose its layout (``auto`` rows) and the recipe names one; else ``plan`` itself."""
    run = plan.run
    if "auto" not in plan.sections or not run.recipe.layout:
        return plan
    rows = layout_rows(plan, overrides, reg, cost)
    return replace(plan, sections={**plan.sections, "auto": [*plan.sections["auto"], *rows]})


def layout_rows(plan: Plan, overrides: list[str], reg: Registry, cost: Cost) -> list[tuple[str, str]]:
    """The two rows: the recipe's layout (or why the plan refuses it) and auto's, each with its
    estimated peak and step time."""
    from olmx.config.compose import compose, to_object

    run = plan.run
    kept = [o for o in overrides if not _chooses_layout(o)]
    source = run.recipe.source or "the recipe"
    theirs = " ".join(run.recipe.layout)
    try:  # without the user's layout, compose puts the recipe's in (olmx.config.compose.recipe_layout)
        recipe_run = to_object(compose(kept, reg), reg)
        t = recipe_run.trainer
        if not any(o.startswith("trainer.micro_batch_size=") for o in run.recipe.layout):
            theirs += f" trainer.micro_batch_size={t.micro_batch_size}"
        if not any(o.startswith("trainer.activation_checkpointing=") for o in run.recipe.layout):
            theirs += f" trainer.activation_checkpointing={t.activation_checkpointing or 'null'}"
        recipe = cost(recipe_run)
        text = f"{theirs}: {describe(*recipe, plan.world)}"
        if recipe_ran_here(recipe_run, plan.world):
            text += f"; {source} trains it on {plan.world.device_name}"
    except ConfigError as exc:
        recipe, text = None, f"{theirs}: refused here ({exc})"
    ours = cost(run)
    rows = [(f"{source}'s layout", text), ("auto's layout", describe(*ours, plan.world))]
    if recipe is not None:
        rows.append(("beside it", verdict(ours, recipe, plan.world)))
    return rows


def describe(peak: int, seconds: float | None, world: World) -> str:
    """``estimated peak X of Y usable, step Z s``."""
    cap = usable_gib(world)
    fits = "" if cap is None else (" (fits)" if peak <= cap * (1 << 30) else f" (more than {cap:.1f} GiB usable)")
    step = f"{seconds:,.3g} s per step" if seconds else "step time unknown"
    return f"estimated peak {gib(peak)} per process{fits}, {step}"


def verdict(ours: tuple[int, float | None], theirs: tuple[int, float | None], world: World) -> str:
    """How auto's choice compares with the recipe's layout on memory and step time."""
    (peak, seconds), (ref_peak, ref_seconds) = ours, theirs
    memory = f"peak {peak / ref_peak:.2f}x the recipe's"
    time = f"step time {seconds / ref_seconds:.2f}x" if seconds and ref_seconds else "step time not estimated"
    cap = usable_gib(world)
    if cap is not None and ref_peak > cap * (1 << 30):
        return f"{memory}, {time}: the recipe's layout does not fit {world.device_name} by this estimate"
    return f"{memory}, {time}"


def _chooses_layout(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in LAYOUT_KEYS)
