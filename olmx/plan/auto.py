"""``auto`` settings, chosen from the plan's memory estimate before anything is launched (no torch).

What can be ``auto``: ``parallel=auto`` (the whole layout, from the installed parallel plugins
by what they provide, :data:`olmx.api.PARALLEL_CAPABILITIES`), a parallel plugin's own fields
(``parallel.ulysses.degree=auto``: the plugin's :meth:`~olmx.api.ParallelPlugin.options`),
``trainer.activation_checkpointing=auto`` and ``trainer.auto_micro_batch=true``.

The candidates are tried in the order an expert lays a run out, and the first whose estimated
peak fits the device wins (each is checked exactly as an explicit run is: a candidate the plan
refuses is skipped with its reason). A parallel dimension is added last, because it costs
communication in every layer and shrinks the work each GPU does; before it, the micro-batch is
lowered and activations are recomputed:

1. the parallel dimensions added: none first, then the smallest sequence-parallel degree, then
   the smallest tensor-parallel degree, then the smallest pipeline degree
   (:data:`~olmx.api.ADD_ON_CAPABILITIES`), then sequence or tensor x pipeline parallel
   (:data:`COMBINED_ADD_ONS`, by the first's degree, then the pipeline's); so sequence
   parallelism is never added to sequences that fit without it;
2. activation checkpointing: none, budget, long_context, full, the one that fits and
   recomputes least at that level (recompute costs FLOPs, :mod:`olmx.plan.throughput`; budget
   only where the blocks are compiled, at ``trainer.activation_memory_budget`` and then at
   :data:`LOWER_BUDGETS`, the largest that fits), with ``trainer.activation_checkpointing=auto``
   or, under ``parallel=auto``, where it is left unset (null);
3. the data-parallel kind in the order of :data:`~olmx.api.PARALLEL_CAPABILITIES` (replicate <
   experts < hybrid < shard; experts only with a layer that has experts, hybrid only over
   several nodes; sharding overlaps its all-gathers with compute, which recompute cannot), then
   each plugin's own options in its order;
4. the micro-batch, largest first: under ``parallel=auto`` every divisor of the layout's per-rank
   batch up to ``trainer.micro_batch_size`` (a micro-batch that does not divide the batch a
   layout gives each rank is lowered, not a reason to refuse the layout), with
   ``trainer.auto_micro_batch`` every divisor; a smaller one only adds gradient accumulation steps.

"Fits" is against :func:`olmx.plan.memory.usable_gib`: one GPU's memory less its headroom, or on CPUs this
machine's RAM divided by its processes. Where nothing fits, a GPU run is refused with every
candidate's estimate; a CPU run (where RAM is soft: swap, other processes) takes the smallest
estimate and the plan warns. Where the device's memory is unknown, the first candidate the plan
accepts is taken, and the plan says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from olmx.config.schema import AUTO, ActivationCheckpointing, RunConfig
from olmx.errors import ConfigError, OlmxError
from olmx.plan.execution import compiles
from olmx.plan.memory import GIB, gib, usable_gib
from olmx.types import ADD_ON_CAPABILITIES, PARALLEL_CAPABILITIES, World

#: ``trainer.activation_checkpointing`` by recompute, cheapest first.
AC_BY_COST: tuple[ActivationCheckpointing | None, ...] = (
    None,
    ActivationCheckpointing.budget,
    ActivationCheckpointing.long_context,
    ActivationCheckpointing.full,
)
#: ``trainer.activation_memory_budget`` values auto also tries below the configured one, largest
#: first, where it chooses ``budget`` checkpointing (a lower budget keeps less and recomputes more).
LOWER_BUDGETS = (0.4, 0.3, 0.2, 0.1)
#: Trials shown in the plan before the chosen one (the rest are counted).
SHOWN = 6
#: Pairs of add-on capabilities ``parallel=auto`` also tries together, after every single one:
#: sequence x pipeline, then tensor x pipeline parallelism (3-D with the data-parallel strategy).
#: Sequence and tensor parallelism do not compose yet (:meth:`olmx.types.Mesh.data_parallel_ranks`).
COMBINED_ADD_ONS: tuple[tuple[str, str], ...] = (("sequence", "pipeline"), ("tensor", "pipeline"))


@dataclass(frozen=True)
class Fit:
    """What the plan estimates for one concrete run (the evaluator's answer)."""

    #: Estimated peak bytes per process.
    peak: int
    #: Data-parallel ranks of its mesh.
    dp: int
    #: FLOPs per token its activation checkpointing recomputes (:mod:`olmx.plan.throughput`).
    recompute: int = 0


#: Checks one concrete run as the plan does and estimates it; raises ConfigError where refused.
Evaluate = Callable[[RunConfig], Fit]


@dataclass(frozen=True)
class ParallelOption:
    """One way to lay out the parallel plugins that ``auto`` tries (not :class:`olmx.api.Layout`,
    a strategy's layout of the data-parallel ranks): their settings and the overrides that
    select them."""

    #: Parallel plugin name -> its settings.
    parallel: dict[str, Any]
    #: The overrides that select this option (``parallel=[fsdp]``, ...).
    overrides: tuple[str, ...]
    #: Which parallel dimensions it adds to data parallelism (0: none; options of one level are
    #: tried together, a level's with every checkpointing mode before the next level's).
    level: int = 0


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided."""

    #: The concrete run (no ``auto`` left).
    run: RunConfig
    #: The overrides that select it explicitly (``olmx train ... OVERRIDES``).
    overrides: tuple[str, ...]
    #: The plan's ``auto`` rows (empty when nothing was ``auto``).
    rows: list[tuple[str, str]]
    #: A warning for the plan (a CPU run where nothing fits), or "".
    warning: str = ""


def parallel_options(run: RunConfig, world: World, reg: Any) -> list[ParallelOption]:
    """The parallel layouts to try, cheapest first: for ``parallel=auto`` built from the
    installed plugins' capabilities, otherwise the product of the listed plugins' options."""
    if AUTO not in run.parallel:
        plugins = [(reg.get("parallel", name), cfg) for name, cfg in run.parallel.items()]
        per_plugin = [[(plugin.name, o, c) for o, c in plugin.options(cfg, run, world)] for plugin, cfg in plugins]
        return [  # each of a plugin's own options (a larger degree) adds parallelism: a level of its own
            ParallelOption({name: c for name, _, c in combo}, tuple(o for _, o, _ in combo if o), level)
            for level, combo in enumerate(itertools.product(*per_plugin))
        ]
    if len(run.parallel) > 1:
        others = ",".join(n for n in run.parallel if n != AUTO)
        raise ConfigError(
            "parallel",
            f"auto chooses every parallel strategy, so it cannot be listed with {others}: write parallel=auto "
            f"alone, or list the strategies yourself (parallel=[{others}])",
        )
    if world.size == 1:
        return [ParallelOption({}, ("parallel=[]",))]
    installed = _installed_parallel(reg)
    experts = any(plugin.experts for _, plugin, _ in reg.layers_in_order(run.layers))
    kinds = [k for k in PARALLEL_CAPABILITIES if k not in ADD_ON_CAPABILITIES]
    kinds = [k for k in kinds if (k != "experts" or experts) and (k != "hybrid" or world.nnodes > 1)]
    data = [
        (rank, i, plugin, override, cfg)
        for rank, kind in enumerate(kinds)
        for plugin in installed
        if plugin.data_parallel and kind in plugin.provides
        for i, (override, cfg) in enumerate(plugin.options(None, run, world))
    ]
    # add-ons in this order: none, each sequence-parallel option, each tensor-parallel one, each
    # pipeline one, then each pair of options :data:`COMBINED_ADD_ONS` names
    single = {
        kind: [
            (plugin, override, cfg)
            for plugin in installed
            if not plugin.data_parallel and kind in plugin.provides
            for override, cfg in plugin.options(None, run, world)
        ]
        for kind in ADD_ON_CAPABILITIES
    }
    add_ons: list[tuple[tuple[Any, str, Any], ...]] = [()]
    add_ons += [(option,) for kind in ADD_ON_CAPABILITIES for option in single[kind]]
    add_ons += [
        (a, b)
        for first, second in COMBINED_ADD_ONS
        for a, b in itertools.product(single[first], single[second])
        if a[0].name != b[0].name
    ]
    combos = sorted(
        ((a, s, d) for a, s in enumerate(add_ons) for d in data), key=lambda asd: (asd[0], asd[2][0], asd[2][1])
    )
    out = []
    for level, options, (_, _, dp_plugin, dp_override, dp_cfg) in combos:
        parallel = {dp_plugin.name: dp_cfg} | {plugin.name: cfg for plugin, _, cfg in options}
        names = f"parallel=[{','.join(parallel)}]"
        overrides = (names, dp_override, *(override for _, override, _ in options))
        out.append(ParallelOption(parallel, tuple(o for o in overrides if o), level))
    return out


def _installed_parallel(reg: Any) -> list[Any]:
    """The loadable parallel plugins, by name."""
    out = []
    for entry in reg.entries("parallel"):
        if not entry.usable:
            continue
        try:
            out.append(reg.get("parallel", entry.name))
        except OlmxError:
            continue
    return sorted(out, key=lambda p: p.name)


def choose(run: RunConfig, world: World, reg: Any, evaluate: Evaluate) -> Choice:
    """The concrete run for ``run``'s ``auto`` settings (see the module docstring); ``run``
    itself, with no rows, when nothing is ``auto``."""
    t = run.trainer
    # under parallel=auto an unset checkpointing is tried before a parallel dimension is added
    free_ac = t.activation_checkpointing == AUTO or (AUTO in run.parallel and t.activation_checkpointing is None)
    compiled = compiles(t, world)  # budget is the compiler's: tried only where blocks compile
    modes = tuple(a for a in AC_BY_COST if a != "budget" or compiled) if free_ac else (t.activation_checkpointing,)
    # (mode, budget): budget checkpointing at the configured budget, then lower ones, where auto chooses
    budgets = [t.activation_memory_budget] + [b for b in LOWER_BUDGETS if b < t.activation_memory_budget]
    acs = [(mode, b) for mode in modes for b in (budgets if mode == "budget" and free_ac else [None])]
    lays = parallel_options(run, world, reg)
    asked = [f for f, on in _asked(run, lays) if on]
    if not asked:
        return Choice(run, (), [])
    cap = usable_gib(world)
    tried: list[tuple[tuple[str, ...], int | None, str]] = []
    valid: list[tuple[int, RunConfig, tuple[str, ...]]] = []
    errors: list[ConfigError] = []
    lower = AUTO in run.parallel  # a layout's per-rank batch decides the micro-batch

    def first_fit(
        level: int, ac: ActivationCheckpointing | None, budget: float | None
    ) -> tuple[RunConfig, tuple[str, ...], Fit] | None:
        """The first candidate of ``level`` with checkpointing ``ac`` (at ``budget``: its memory
        budget, None: the configured one) that fits, in order."""
        own = t.activation_memory_budget if budget is None else budget
        trainer = replace(t, activation_checkpointing=ac, activation_memory_budget=own)
        ac_override: tuple[str, ...] = (f"trainer.activation_checkpointing={ac or 'null'}",) if len(acs) > 1 else ()
        if budget is not None and budget != t.activation_memory_budget:
            ac_override += (f"trainer.activation_memory_budget={budget:g}",)
        for lay in (lay for lay in lays if lay.level == level):
            base = replace(run, parallel=lay.parallel, trainer=trainer)
            for micro in _micro_batches(base, evaluate, errors, lay, tried, lower=lower):
                cand = replace(base, trainer=replace(base.trainer, micro_batch_size=micro, auto_micro_batch=False))
                changed = t.auto_micro_batch or micro != t.micro_batch_size
                overrides = lay.overrides + ac_override + ((f"trainer.micro_batch_size={micro}",) if changed else ())
                try:
                    fit = evaluate(cand)
                except ConfigError as exc:
                    errors.append(exc)
                    tried.append((overrides, None, f"refused: {exc}"))
                    continue
                if cap is None or fit.peak <= cap * GIB:
                    return cand, overrides, fit
                tried.append((overrides, fit.peak, f"{gib(fit.peak)} > {cap:.1f} GiB"))
                valid.append((fit.peak, cand, overrides))
        return None

    for level in sorted({lay.level for lay in lays}):
        # each checkpointing mode's first fit at this level; the least recompute wins (what a mode
        # recomputes depends on the model and the sequence, not on the layout: budget recomputes
        # the attention, long_context the feed-forward); nothing recomputed ends the search
        fitting: list[tuple[RunConfig, tuple[str, ...], Fit]] = []
        budget_fits = False  # a lower budget than one that fits only recomputes more
        for ac, budget in acs:
            if budget is not None and budget_fits:
                continue
            found = first_fit(level, ac, budget)
            if found is not None:
                fitting.append(found)
                budget_fits = budget_fits or budget is not None
                if found[2].recompute == 0:
                    break
        if fitting:
            cand, overrides, fit = min(fitting, key=lambda f: f[2].recompute)  # the first of equals
            for other, other_overrides, other_fit in fitting:
                if other is not cand:
                    more = other_fit.recompute - fit.recompute
                    why = f"fits ({gib(other_fit.peak)}), but recomputes {more / 1e9:,.3g} GFLOPs per token more"
                    tried.append((other_overrides, other_fit.peak, why))
            return Choice(cand, overrides, _rows(overrides, fit, cand, run, cap, world, tried))
    return _nothing_fits(asked, valid, errors, tried, cap, world)


def _asked(run: RunConfig, lays: list[ParallelOption]) -> list[tuple[str, bool]]:
    """The fields set to ``auto``, for messages."""
    t = run.trainer
    return [
        ("parallel", AUTO in run.parallel or len(lays) > 1 or any(lay.overrides for lay in lays)),
        ("trainer.activation_checkpointing", t.activation_checkpointing == AUTO),
        ("trainer.auto_micro_batch", t.auto_micro_batch),
    ]


def _micro_batches(
    run: RunConfig,
    evaluate: Evaluate,
    errors: list[ConfigError],
    lay: ParallelOption,
    tried: list[Any],
    *,
    lower: bool = False,
) -> list[int]:
    """``trainer.micro_batch_size`` as given; with ``lower`` (``parallel=auto``) every divisor of
    this layout's per-rank batch up to it; with ``auto_micro_batch`` every divisor; largest first."""
    t = run.trainer
    if not t.auto_micro_batch and not lower:
        return [t.micro_batch_size]
    try:  # the layout's data-parallel ranks (a micro-batch of 1 always divides the batch)
        dp = evaluate(replace(run, trainer=replace(t, micro_batch_size=1, auto_micro_batch=False))).dp
    except ConfigError as exc:
        errors.append(exc)
        tried.append((lay.overrides, None, f"refused: {exc}"))
        return []
    per_rank = t.global_batch_size // dp
    top = per_rank if t.auto_micro_batch else min(per_rank, t.micro_batch_size)
    return [m for m in range(top, 0, -1) if not per_rank % m]


def _rows(
    overrides: tuple[str, ...],
    fit: Fit,
    chosen: RunConfig,
    asked: RunConfig,
    cap: float | None,
    world: World,
    tried: list[tuple[tuple[str, ...], int | None, str]],
) -> list[tuple[str, str]]:
    where = f"{cap:.1f} GiB usable per process ({world.device_name})" if cap else "memory unknown"
    rows = [("chosen", " ".join(overrides) or "the settings as given")]
    if cap is None:
        rows.append(("why", f"the first setting the plan accepts; {world.device_name}'s memory is unknown"))
    else:
        rows.append(("why", f"the cheapest setting that fits: estimated peak {gib(fit.peak)} of {where}"))
    micro, given = chosen.trainer.micro_batch_size, asked.trainer.micro_batch_size
    if micro < given and not asked.trainer.auto_micro_batch:
        per_rank = chosen.trainer.global_batch_size // fit.dp
        reason = (
            f"{chosen.trainer.global_batch_size} sequences over {fit.dp} data-parallel ranks leave {per_rank} per rank"
            if per_rank < given or per_rank % given
            else "the larger ones do not fit"
        )
        rows.append(("micro-batch", f"lowered from trainer.micro_batch_size={given} to {micro}: {reason}"))
    for ov, _, reason in tried[:SHOWN]:
        rows.append(("tried before", f"{' '.join(ov) or 'as given'}: {reason}"))
    if len(tried) > SHOWN:
        rows.append(("tried before", f"... and {len(tried) - SHOWN} more"))
    rows.append(
        (
            "order",
            "no parallel dimension added before a smaller micro-batch and activation checkpointing are tried; "
            "then the smallest sequence-, tensor- then pipeline-parallel degree; within each: least recompute, "
            "least sharding, the largest micro-batch",
        )
    )
    return rows


def _nothing_fits(
    asked: list[str],
    valid: list[tuple[int, RunConfig, tuple[str, ...]]],
    errors: list[ConfigError],
    tried: list[tuple[tuple[str, ...], int | None, str]],
    cap: float | None,
    world: World,
) -> Choice:
    field = asked[0]
    if not valid:
        if errors and all(str(e) == str(errors[0]) for e in errors):
            raise errors[0]
        reasons = "; ".join(f"{' '.join(ov)}: {why}" for ov, _, why in tried[:SHOWN])
        raise ConfigError(field, f"auto: the plan refuses every setting it could choose ({reasons})")
    peak, run, overrides = min(valid, key=lambda v: v[0])
    assert cap is not None  # with unknown memory the first valid setting is taken
    estimates = "; ".join(f"{' '.join(ov)}: {gib(p)}" for ov, p, _ in tried if p is not None)
    message = (
        f"auto: no setting fits the {cap:.1f} GiB usable per process of {world.device_name} ({estimates}); "
        f"the smallest estimate is {gib(peak)} ({' '.join(overrides)}): use more processes, a smaller model, a shorter "
        f"data.seq_len or a smaller trainer.micro_batch_size"
    )
    if world.device == "cuda":
        raise ConfigError(field, message)
    rows = _rows(overrides, Fit(peak=peak, dp=0), run, run, cap, world, tried)
    rows[1] = ("why", f"nothing fits: took the smallest estimated peak, {gib(peak)} of {cap:.1f} GiB (CPU RAM)")
    return Choice(run, overrides, rows, warning=message)
