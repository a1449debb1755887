"""Plan -> OLMo-core train module, data loader and Trainer (the only place that builds them)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

from olmx.errors import ConfigError
from olmx.kinds import plugins_in_order
from olmx.plan import Plan
from olmx.rundir import RunDir


def train_module_config(plan: Plan, reg: Any, param_names: Sequence[str] | None = None) -> Any:
    """OLMo-core's ``TransformerTrainModuleConfig``: the core's settings (optimizer, schedule),
    every plugin's ``apply_train_module`` in :data:`olmx.kinds.KIND_ORDER` (the order of the
    model's edits), then the plan's dtypes on the ``dp_config`` they set. ``param_names`` (the
    built model's) go to the plugins, and every optimizer group a plugin adds must match one of
    them (None: not checked)."""
    from olmo_core.optim import (
        AdamWConfig,
        ConstantWithWarmup,
        CosWithWarmup,
        LinearWithWarmup,
        OptimGroupOverride,
        SkipStepAdamWConfig,
    )
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    t = plan.run.trainer
    schedulers = {"cosine": CosWithWarmup, "linear": LinearWithWarmup, "constant": ConstantWithWarmup}
    scheduler_kwargs: dict[str, Any] = {"warmup": t.warmup_steps}
    if t.schedule == "linear":
        scheduler_kwargs["alpha_f"] = 0.0
    kwargs: dict[str, Any] = {
        "rank_microbatch_size": plan.batch.micro_tokens,
        "max_sequence_length": plan.batch.seq_len,
        # foreach (multi-tensor) kernels on GPUs; torch's (AdamW) or OLMo-core's default on CPUs.
        "optim": (
            SkipStepAdamWConfig(
                lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay, foreach=plan.world.device == "cuda"
            )
            if t.optimizer == "skip_step_adamw"
            else AdamWConfig(
                lr=t.lr,
                betas=tuple(t.betas),
                weight_decay=t.weight_decay,
                foreach=True if plan.world.device == "cuda" else None,
            )
        ),
        "scheduler": schedulers[t.schedule](**scheduler_kwargs),
        # olmx clips, across device meshes, in its guard (build_trainer).
        "max_grad_norm": None,
        "z_loss_multiplier": t.z_loss,
        "compile_model": plan.execution.compile,
    }
    if t.weight_decay and not t.decay_embeddings:
        kwargs["optim"].group_overrides = [OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})]
    if t.activation_checkpointing:
        kwargs["ac_config"] = activation_checkpointing_config(t.activation_checkpointing, t.activation_memory_budget)
    config = TransformerTrainModuleConfig(**kwargs)
    names = tuple(param_names or ())
    for plugin, cfg in plugins_in_order(plan.run, reg):
        before = len(config.optim.group_overrides or [])
        config = plugin.apply_train_module(cfg, config, plan, names)
        if param_names is not None:
            check_group_overrides(plugin.section, (config.optim.group_overrides or [])[before:], names)
    apply_dtypes(plan, config)  # the plan's dtypes, on whatever dp_config the parallel plugins set
    return config


def check_group_overrides(section: str, overrides: list[Any], names: tuple[str, ...]) -> None:
    """Every parameter pattern of the optimizer groups a plugin added matches a parameter of the
    model (OLMo-core would only warn at build time, or refuse a group left empty)."""
    from fnmatch import fnmatch

    for override in overrides:
        for pattern in override.params:
            if not any(fnmatch(name, pattern) for name in names):
                example = ", ".join(names[:3])
                raise ConfigError(
                    section,
                    f"its optimizer group pattern {pattern!r} matches no parameter of the model "
                    f"({len(names)} parameters, e.g. {example})",
                )


def apply_dtypes(plan: Plan, config: Any) -> None:
    """The plan's :class:`olmx.api.Dtypes`: FSDP2's mixed-precision policy where the mesh
    shards parameters (float32 master shards, all-gathered in ``param``, gradients reduced in
    ``reduce``), ``torch.autocast`` over float32 parameters elsewhere (OLMo-core's DDP
    ``param_dtype`` would cast the master weights too)."""
    from olmo_core.config import DType

    dp = config.dp_config
    if plan.mesh.shards_params and dp is not None:
        dp.param_dtype = DType(plan.dtypes.param)
        dp.reduce_dtype = DType(plan.dtypes.reduce)
    elif plan.dtypes.param != "float32":
        config.autocast_precision = DType(plan.dtypes.param)


#: ``trainer.activation_checkpointing=long_context``: the modules recomputed in backward, in
#: the spirit of AutoSP's sequence-aware checkpointing (arXiv 2604.27089): at long context the
#: attention kernel is the costly part (quadratic in the sequence), so attention is not
#: checkpointed (its outputs, and under Ulysses its all-to-alls, are kept, never recomputed),
#: while the feed-forward (the largest activations, ~4 x hidden per token, and FLOPs linear in
#: the sequence) and the norms (cheap element-wise work) are. OLMo-core's ``selected_modules``
#: mode wraps each matching module in a checkpoint wrapper.
LONG_CONTEXT_AC_MODULES = ["blocks.*.feed_forward", "blocks.*.feed_forward_norm", "blocks.*.attention_norm"]


def activation_checkpointing_config(mode: str, budget: float = 0.5) -> Any:
    """OLMo-core ``TransformerActivationCheckpointingConfig`` for ``trainer.activation_checkpointing``:
    an OLMo-core mode by name (``full``; ``budget`` with ``budget``, the
    ``trainer.activation_memory_budget``), or olmx's ``long_context`` policy."""
    from olmo_core.train.train_module import (
        TransformerActivationCheckpointingConfig,
        TransformerActivationCheckpointingMode,
    )

    if mode == "long_context":
        return TransformerActivationCheckpointingConfig(
            mode=TransformerActivationCheckpointingMode.selected_modules, modules=list(LONG_CONTEXT_AC_MODULES)
        )
    if mode == "budget":
        return TransformerActivationCheckpointingConfig(
            mode=TransformerActivationCheckpointingMode.budget, activation_memory_budget=budget
        )
    return TransformerActivationCheckpointingConfig(mode=TransformerActivationCheckpointingMode(mode))


def plugin_callbacks(plan: Plan, reg: Any) -> dict[str, Any]:
    """Trainer callbacks contributed by the run's plugins (``callbacks(cfg, plan)``); trackers'
    on rank 0 only (:class:`olmx.api.TrackerPlugin`: the trainer reduces metrics onto rank 0)."""
    from olmo_core.distributed.utils import get_rank

    out: dict[str, Any] = {}
    for plugin, cfg in plugins_in_order(plan.run, reg):
        if plugin.kind == "tracker" and get_rank() != 0:
            continue
        out.update(plugin.callbacks(cfg, plan))
    return out


def build_trainer(plan: Plan, reg: Any, model: Any, *, attempt: int = 0) -> Any:
    """Train module, data loader and Trainer for the plan (call inside the distributed env;
    ``attempt``: torchrun's restart count, whose folder the hang watchdog writes to)."""
    from olmo_core.data import NumpyDataLoaderConfig
    from olmo_core.train import Duration, LoadStrategy, TrainerConfig
    from olmo_core.train.callbacks import ConsoleLoggerCallback

    from olmx.data.splits import eval_on
    from olmx.worker.callbacks import OlmxMetricsCallback, OlmxSpeedMonitorCallback, profile_callbacks
    from olmx.worker.checkpoint import KEEP_CHECKPOINTS, OlmxCheckpointerCallback, OlmxCheckpointerConfig
    from olmx.worker.clock import Clock
    from olmx.worker.datasets import build_downstream, build_evaluator, build_train_dataset, data_split
    from olmx.worker.faults import fault_callbacks
    from olmx.worker.stragglers import straggler_callbacks
    from olmx.worker.watchdog import hang_callbacks

    run, rd = plan.run, RunDir(plan.run_dir)
    t, run_dir = run.trainer, rd.path
    config = train_module_config(plan, reg, [name for name, _ in model.named_parameters()])
    if config.pp_config is not None:  # torch's pipeline schedules (olmx.worker.pipeline)
        from olmx.worker.model import edit_model
        from olmx.worker.pipeline import build_pipeline_train_module

        train_module = build_pipeline_train_module(config, model, lambda stage: edit_model(plan, reg, stage))
    else:
        train_module = config.build(model)

    # The training dataset never reads the held-out sequences the evaluator reads (olmx.data.splits).
    splits = data_split(plan)
    dataset = build_train_dataset(plan, splits, rd.work / "dataset")
    data_loader = NumpyDataLoaderConfig(
        global_batch_size=plan.batch.global_tokens,
        seed=run.data_seed,
        num_workers=run.data.num_workers,
        work_dir=str(rd.work / "loader"),
    ).build(dataset, dp_process_group=train_module.dp_process_group)

    callbacks = {
        # trainer.async_save: OLMo-core's asynchronous save, less what deadlocked it on several
        # processes (olmx.worker.checkpoint: research note olmo-core-3.0.md §3.9 found one cause).
        "checkpointer": OlmxCheckpointerCallback(
            save_interval=t.save_interval,
            save_async=t.async_save,
            pre_train_checkpoint=False,
            max_checkpoints=KEEP_CHECKPOINTS,  # what olmx.worker.checkpoint.check_disk_space counts
        ),
        "console_logger": ConsoleLoggerCallback(log_interval=max(plan.execution.log_interval, 10)),
        "speed_monitor": OlmxSpeedMonitorCallback(compute_dtype=plan.dtypes.param),
        "olmx_metrics": OlmxMetricsCallback(
            run_dir=str(run_dir),
            tokens_per_step=plan.batch.global_tokens,
            world_size=plan.world.size,
            resumed_from=plan.resume_step,
        ),
    }
    if eval_on(run):
        callbacks["olmx_eval"] = build_evaluator(
            plan,
            splits,
            collator=data_loader.collator,
            dp_process_group=train_module.dp_process_group,
            work_dir=rd.work / "eval",
        )
    if run.eval.downstream:
        callbacks["olmx_downstream"] = build_downstream(plan, dp_process_group=train_module.dp_process_group)
    # The guard takes the gradient norm, clips and feeds SkipStepAdamW (olmx.worker.faults).
    callbacks.update(fault_callbacks(run, str(run_dir), stop_check_interval=plan.execution.log_interval))
    callbacks["olmx_clock"] = Clock(
        run_dir=str(run_dir), attempt=attempt, eval_interval=run.eval.interval or 0, resumed_from=plan.resume_step
    )
    callbacks.update(straggler_callbacks(plan.world.device, plan.execution.log_interval))
    callbacks.update(hang_callbacks(str(run_dir), plan.execution.hang_timeout, plan.world.device, attempt))
    callbacks.update(profile_callbacks(t, rd.profile))
    callbacks.update(plugin_callbacks(plan, reg))
    return TrainerConfig(
        save_folder=str(rd.checkpoints),
        work_dir=str(rd.work),
        # olmx chooses and verifies the checkpoint to resume from and loads it itself
        # (olmx.worker.checkpoint.resume_from_verified); OLMo-core would take the newest on trust.
        load_strategy=LoadStrategy.never,
        checkpointer=OlmxCheckpointerConfig(),
        save_overwrite=True,
        max_duration=Duration.steps(t.max_steps),
        hard_stop=Duration.steps(t.stop_at_step) if t.stop_at_step else None,
        metrics_collect_interval=plan.execution.log_interval,
        # Stop signals are agreed by olmx's TrainingGuard every step, synchronously; OLMo-core's
        # asynchronous cancel check (which ranks can see at different steps) never runs.
        cancel_check_interval=t.max_steps + 1,
        callbacks=callbacks,
    ).build(train_module, data_loader)


def reset_run_dir(run_dir: str) -> None:
    """``trainer.resume=false``: move earlier checkpoints aside (``checkpoints/`` is renamed to
    ``checkpoints.old-<time>/``; nothing is deleted), and start this run dir's metrics, summary
    and fault markers over (olmx's own files; ``events.jsonl`` keeps the history, a ``fresh``
    record, with ``moved_to``, marks the new start)."""
    from olmx.events import append_event
    from olmx.worker.callbacks import truncate_metrics

    rd = RunDir(run_dir)
    moved = rd.move_checkpoints_aside()
    shutil.rmtree(rd.work / "faults", ignore_errors=True)
    shutil.rmtree(rd.clock, ignore_errors=True)  # the goodput of the fresh run only
    rd.summary.unlink(missing_ok=True)
    truncate_metrics(run_dir, None)
    append_event(run_dir, "fresh", moved_to=str(moved) if moved else None)
