"""RunConfig -> Plan: every check, no torch.

All cross-plugin validation happens here, before anything is launched or written, and
raises :class:`ConfigError` naming the field and the numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from olmx import __version__
from olmx.config.schema import ModelConfig, RunConfig
from olmx.data.checks import check_data, check_data_settings, check_eval, default_holdout
from olmx.data.tokenizer import resolve_tokenizer
from olmx.errors import ConfigError
from olmx.kinds import plugins_in_order
from olmx.plan import BatchPlan, ParamCounts, Plan
from olmx.plan.downstream import plan_downstream
from olmx.plan.duration import resolve_duration
from olmx.plan.execution import kernel_warnings, resolve_execution
from olmx.plan.hf import check_init_from, hf_export_row
from olmx.plan.linears import dense_linears
from olmx.plan.memory import MemoryEstimate
from olmx.plan.mesh import check_experts, check_tensor_parallel, resolve_mesh
from olmx.plan.reference import recipe_ran_here
from olmx.plan.resume import check_resume
from olmx.registry import Registry
from olmx.rundir import RunDir
from olmx.types import Context, Contribution, Mesh, World, check_dtypes
from olmx.writable import check_writable

if TYPE_CHECKING:
    from olmx.plan.auto import Evaluate


def padded_vocab(vocab_size: int, multiple: int = 128) -> int:
    """Vocabulary rounded up as OLMo-core's ``TokenizerConfig.padded_vocab_size`` does."""
    return -(-vocab_size // multiple) * multiple


def count_params(model: ModelConfig, vocab: int) -> ParamCounts:
    """Parameters of the OLMo-core llama-like transformer ``model`` builds (tested against
    OLMo-core's own count for every preset)."""
    d, h = model.d_model, model.n_heads
    kv = model.n_kv_heads or h
    head_dim = d // h
    attn = d * h * head_dim + 2 * d * kv * head_dim + h * head_dim * d
    if model.qk_norm:
        attn += h * head_dim + kv * head_dim
    block = attn + 3 * d * model.hidden_size + 2 * d
    embedding = vocab * d
    total = embedding + model.n_layers * block + d + d * vocab
    return ParamCounts(total=total, embedding=embedding, active=total)


def plan_from_overrides(overrides: list[str], reg: Registry, *, now: datetime | None = None) -> Plan:
    """The plan that ``olmx train OVERRIDES`` runs: the overrides composed with the config tree,
    typed, and resolved."""
    from olmx.config.compose import compose, to_object
    from olmx.plan.reference import with_recipe_layout

    plan = resolve(to_object(compose(overrides, reg), reg), reg, now=now)
    return with_recipe_layout(plan, overrides, reg, lambda run: run_cost(run, plan.world, reg))


def local_plan(run_dir: str | Path, reg: Registry) -> Plan:
    """The run's plan, resolved again for one process on this machine (``model.init_from`` is
    dropped: the checkpoint supplies the weights): what ``olmx generate`` and ``olmx export`` hand
    :mod:`olmx.local_model`."""
    from olmx.config.compose import compose, to_object

    rd = RunDir(run_dir)
    saved = Plan.load(rd.path / "plan.yaml", reg)
    run = saved.run
    # This machine, one process: the default infra target of conf/train.yaml.
    here = to_object(compose(["infra.nproc_per_node=1"], reg), reg).infra
    t = run.trainer
    trainer = replace(t, resume=False, run_dir=str(rd.path), micro_batch_size=1, global_batch_size=1, compile="false")
    model = replace(run.model, init_from=None)
    one = replace(run, model=model, infra=here, parallel={}, trainer=trainer)
    return resolve(one, reg)


def resolve(run: RunConfig, reg: Registry, *, now: datetime | None = None) -> Plan:
    """Check the run and compute its plan (see :mod:`olmx.api` for the passes)."""
    infra = reg.get("infra", run.infra_name)
    world: World = infra.world(run.infra[run.infra_name])
    if world.size < 1:
        raise ConfigError("infra", f"the run needs at least one process, got {world.nnodes} x {world.nproc_per_node}")
    files_here = infra.data_on_this_machine(run.infra[run.infra_name])
    from olmx.config.compose import preset

    run = resolve_tokenizer(run, preset=preset("data", run.data.name).get("tokenizer"), files_here=files_here)
    _check_model(run.model)
    _check_trainer(run)
    check_data_settings(run)  # before the held-out split divides by data.seq_len
    run, eval_off = default_holdout(run, files_here=files_here)
    run, duration_rows = resolve_duration(run, files_here=files_here)  # max_steps, before the data's checks use it
    data_rows = check_data(run, files_here=files_here) + duration_rows

    from olmx.plan import auto, memory, throughput

    choice = auto.choose(run, world, reg, make_evaluator(world, reg))  # the user's run where nothing is auto
    run = choice.run
    ev = estimate_run(run, world, reg)
    ctx, contributions, batch, params, est, sharded = ev.ctx, ev.contributions, ev.batch, ev.params, ev.est, ev.sharded
    mesh, dtypes, vocab = ctx.mesh, ctx.dtypes, ctx.vocab_size
    data_rows += check_eval(run, mesh, files_here=files_here, off=eval_off)
    assert ctx.execution is not None
    execution = ctx.execution
    ran_here = recipe_ran_here(run, world)
    mem_warnings = memory.check(est, run, mesh, world, params.total, vocab, dtypes.param, sharded, ran_here)
    mem_rows = memory.rows(est, world)
    idle = max((c.idle_fraction for c in contributions.values()), default=0.0)
    timing = throughput.estimate(run, world, params, batch, dtypes.param, idle=idle)
    time_rows = throughput.rows(timing, run, world, dtypes.param)
    data_rows += plan_downstream(
        run,
        mesh,
        batch.micro_seqs,
        files_here=files_here,
        forward_flops=timing.flops.model // 3,
        flops_per_s=timing.peak * run.trainer.assumed_mfu if timing.peak else None,
    )
    run_dir = _run_dir(run, now or datetime.now())
    resume_step = RunDir(run_dir).latest_checkpoint() if run.trainer.resume else None
    if resume_step is not None:
        check_resume(run, run_dir, resume_step)
    model_rows = check_init_from(run, vocab, resume_step) if run.model.init_from else []
    model_rows.append(hf_export_row(run, reg))  # what olmx export hf will make of its checkpoints
    return Plan(
        run=run,
        world=world,
        mesh=mesh,
        dtypes=dtypes,
        batch=batch,
        params=params,
        vocab_size=vocab,
        run_dir=run_dir,
        resume_step=resume_step,
        execution=execution,
        decisions={k: c.decisions for k, c in contributions.items() if c.decisions},
        sections={
            "data": data_rows,
            **({"model": model_rows} if model_rows else {}),
            **{k: c.rows for k, c in contributions.items()},
            **({"auto": choice.rows} if choice.rows else {}),
            "memory": mem_rows,
            "time": time_rows,
            **(
                {"warnings": warnings}
                if (
                    warnings := _warnings(run)
                    + _scale_warnings(run, params)
                    + [("auto", choice.warning)] * bool(choice.warning)
                    + [("world", w) for w in world.warnings]
                    + [("attention", w) for w in kernel_warnings(execution, world, dtypes)]
                    + [("memory", w) for w in mem_warnings]
                )
                else {}
            ),
        },
        olmx_version=__version__,
    )


def make_evaluator(world: World, reg: Registry) -> Evaluate:
    """What :func:`olmx.plan.auto.choose` asks of each candidate: checked as the plan checks a
    run (:func:`estimate_run`, ConfigError where refused), its estimated peak and what its
    activation checkpointing recomputes (:mod:`olmx.plan.throughput`)."""
    from olmx.plan import auto, throughput

    def fit(candidate: RunConfig) -> auto.Fit:
        e = estimate_run(candidate, world, reg)
        t = candidate.trainer
        flops = throughput.flops_per_token(
            candidate.model,
            params=e.params,
            seq_len=e.batch.seq_len,
            activation_checkpointing=t.activation_checkpointing,
            memory_budget=t.activation_memory_budget,
        )
        return auto.Fit(peak=e.est.peak, dp=e.mesh.dp, recompute=flops.recompute)

    return fit


@dataclass(frozen=True)
class Estimated:
    """A run checked against its world as far as its memory estimate (resolve's passes up to
    the plugins' ``resolve``, the batch geometry, the parameter counts)."""

    ctx: Context
    contributions: dict[str, Contribution]
    batch: BatchPlan
    params: ParamCounts
    est: MemoryEstimate
    #: ``(parameters, ranks)`` the plugins spread over ranks themselves.
    sharded: tuple[tuple[int, int], ...]

    @property
    def mesh(self) -> Mesh:
        """The run's mesh."""
        return self.ctx.mesh


def run_cost(run: RunConfig, world: World, reg: Registry) -> tuple[int, float | None]:
    """``(estimated peak bytes per process, seconds per step or None)`` of ``run`` on ``world``
    (ConfigError where the plan refuses the run): a recipe's layout beside auto's
    (:mod:`olmx.plan.reference`)."""
    from olmx.plan import throughput

    e = estimate_run(run, world, reg)
    idle = max((c.idle_fraction for c in e.contributions.values()), default=0.0)
    step = throughput.estimate(run, world, e.params, e.batch, e.ctx.dtypes.param, idle=idle)
    return e.est.peak, step.seconds


def estimate_run(run: RunConfig, world: World, reg: Registry) -> Estimated:
    """The passes of :func:`resolve` that decide the memory estimate; raises ConfigError where
    the run is refused. Resolve runs them once per ``auto`` candidate (:mod:`olmx.plan.auto`)."""
    from olmx.plan import memory

    ctx = build_context(run, world, reg)
    mesh, vocab = ctx.mesh, ctx.vocab_size
    contributions: dict[str, Contribution] = {}
    for plugin, cfg in plugins_in_order(run, reg):
        contributions[plugin.section] = plugin.resolve(cfg, ctx)

    t = run.trainer
    per_step = t.micro_batch_size * mesh.dp
    if t.global_batch_size % per_step:
        raise ConfigError(
            "trainer.global_batch_size",
            f"{t.global_batch_size} sequences must be a multiple of trainer.micro_batch_size ({t.micro_batch_size}) "
            f"x data-parallel ranks ({mesh.dp}) = {per_step}",
        )
    batch = BatchPlan(
        seq_len=run.data.seq_len,
        global_seqs=t.global_batch_size,
        micro_seqs=t.micro_batch_size,
        dp_ranks=mesh.dp,
        grad_accum=t.global_batch_size // per_step,
    )

    base = count_params(run.model, vocab)
    extra = sum(c.params for c in contributions.values())
    extra_active = sum(c.active_params for c in contributions.values())
    params = ParamCounts(total=base.total + extra, embedding=base.embedding, active=base.active + extra_active)
    sharded = tuple((c.sharded_params, c.sharded_over) for c in contributions.values() if c.sharded_params)
    plugin_acts = sum(c.activation_bytes_per_token for c in contributions.values())
    gathered = sum(c.gathered_params for c in contributions.values())
    inflight = max((c.microbatches_in_flight for c in contributions.values()), default=1)
    est = memory.estimate(
        run,
        mesh,
        params.total,
        vocab,
        ctx.dtypes.param,
        world.device,
        sharded,
        plugin_acts,
        gathered,
        inflight,
        compiled=ctx.execution is not None and ctx.execution.compile,
    )
    return Estimated(ctx, contributions, batch, params, est, sharded)


def build_context(run: RunConfig, world: World, reg: Registry) -> Context:
    """Resolve's first passes: the mesh (parallel plugins' claims and layout), the precision
    plugin's dtypes, the layers in order; what every plugin's ``resolve`` then checks against."""
    parallel = [(reg.get("parallel", name), cfg) for name, cfg in run.parallel.items()]
    mesh = resolve_mesh(run, world, parallel, reg)
    precision = reg.get("precision", run.precision_name)
    settings = run.precision[run.precision_name]
    dtypes = precision.dtypes(settings, run, world, mesh)
    check_dtypes(dtypes, mesh=mesh, world=world, plugin=precision.name, section=precision.section, cfg=settings)
    layers = tuple((plugin, cfg) for _, plugin, cfg in reg.layers_in_order(run.layers))
    vocab = padded_vocab(run.data.tokenizer.vocab_size)
    ctx = Context(
        run=run,
        world=world,
        mesh=mesh,
        dtypes=dtypes,
        vocab_size=vocab,
        layers=layers,
        execution=resolve_execution(run, world, dtypes),
        dense_layers=tuple(dense_linears(run.model, vocab)),
    )
    if mesh.ep > 1:
        check_experts(ctx, reg)
    check_tensor_parallel(ctx)
    return ctx


def _check_model(m: ModelConfig) -> None:
    """The model's rules that join fields (each field's own rule is checked by olmx.rules)."""
    if (m.d_model // m.n_heads) % 2:
        raise ConfigError(
            "model.d_model",
            f"model.d_model={m.d_model} / model.n_heads={m.n_heads} makes heads of {m.d_model // m.n_heads} "
            "dimensions; OLMo-core's RoPE rotates pairs of dimensions, so the head dimension must be even",
        )


def _check_trainer(run: RunConfig) -> None:
    """The trainer's rules that join fields (each field's own rule is checked by olmx.rules)."""
    t = run.trainer
    if t.stop_at_step is not None and t.max_tokens is None and t.epochs is None and t.stop_at_step > t.max_steps:
        raise ConfigError("trainer.stop_at_step", f"{t.stop_at_step} must be in [1, trainer.max_steps={t.max_steps}]")


def _warnings(run: RunConfig) -> list[tuple[str, str]]:
    """Settings that run but are probably not what was meant: the plan's ``warnings`` rows.

    A warm-up longer than the run is a warning, not an error: short smoke runs of a recipe
    (``trainer.max_steps=6``) keep its warm-up, and OLMo-core trains them correctly, only
    never at the peak learning rate. The row says what the run gets instead."""
    t = run.trainer
    rows = []
    if t.warmup_steps > t.max_steps:
        peak = t.lr * t.max_steps / t.warmup_steps
        rows.append(
            (
                "warm-up",
                f"trainer.warmup_steps={t.warmup_steps} is longer than the run (trainer.max_steps={t.max_steps}): "
                f"the learning rate only reaches {peak:.3g} of trainer.lr={t.lr:g}, and trainer.schedule="
                f"{t.schedule} never starts",
            )
        )
    return rows


#: A model this large (parameters) ...
LARGE_MODEL = 10**9
#: ... is pre-trained on long sequences and millions of tokens per step: OLMo 3 7B on 512
#: sequences of 8,192 tokens = 4,194,304 tokens per step (OLMo-core 3's official script,
#: ``src/scripts/official/OLMo3/OLMo-3-1025-7B-pretrain-1.py``). The plan warns below a
#: quarter of either.
REFERENCE_SEQ_LEN, REFERENCE_STEP_TOKENS = 8192, 512 * 8192


def _scale_warnings(run: RunConfig, params: ParamCounts) -> list[tuple[str, str]]:
    """A large model with a short sequence or a small batch (the defaults are for the tiny
    model): a smoke test, or settings that were not carried over."""
    seq, seqs = run.data.seq_len, run.trainer.global_batch_size
    if params.total < LARGE_MODEL or (seq >= REFERENCE_SEQ_LEN // 4 and seq * seqs >= REFERENCE_STEP_TOKENS // 4):
        return []
    return [
        (
            "scale",
            f"model={run.model.name} has {params.total / 1e9:.1f}B parameters but trains on data.seq_len={seq:,} x "
            f"trainer.global_batch_size={seqs} = {seq * seqs:,} tokens per step; OLMo 3 7B was pre-trained on "
            f"{REFERENCE_SEQ_LEN:,}-token sequences, {REFERENCE_STEP_TOKENS:,} tokens per step (OLMo-core's official "
            f"script). Fine for a smoke test; for training set data.seq_len and trainer.global_batch_size",
        )
    ]


def _run_dir(run: RunConfig, now: datetime) -> str:
    t = run.trainer
    if t.run_dir:
        path = Path(os.path.expanduser(t.run_dir)).absolute()
    else:
        path = (Path(t.runs_root).expanduser() / f"{now:%Y%m%d-%H%M%S}-{run.model.name}").absolute()
    check_writable(path, "trainer.run_dir")
    RunDir(path).check_claimable("trainer.run_dir")  # a non-empty folder olmx did not make is not a run dir
    return str(path)
