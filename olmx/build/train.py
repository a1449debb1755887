"""Plan -> OLMo-core train module, data loader and Trainer (the only place that builds them)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from olmx.plan import Plan
from olmx.plan.resolve import CHECKPOINTS

#: Order in which plugin kinds fill the train-module config: parallel strategies first, then
#: precision (it adjusts the data-parallel config they set), then layers (optimizer groups).
APPLY_ORDER = (("parallel", "parallel"), ("precision", "precision"), ("layer", "layers"))


def train_module_kwargs(plan: Plan, run: Any, reg: Any) -> dict[str, Any]:
    """Keyword arguments of OLMo-core's ``TransformerTrainModuleConfig``, plugins applied."""
    from olmo_core.optim import AdamWConfig, ConstantWithWarmup, CosWithWarmup, LinearWithWarmup
    from olmo_core.train.train_module import (
        TransformerActivationCheckpointingConfig,
        TransformerActivationCheckpointingMode,
    )

    t = run.trainer
    schedulers = {"cosine": CosWithWarmup, "linear": LinearWithWarmup, "constant": ConstantWithWarmup}
    scheduler_kwargs: dict[str, Any] = {"warmup": t.warmup_steps}
    if t.schedule == "linear":
        scheduler_kwargs["alpha_f"] = 0.0
    kwargs: dict[str, Any] = {
        "rank_microbatch_size": plan.batch.micro_tokens,
        "max_sequence_length": plan.batch.seq_len,
        "optim": AdamWConfig(lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay),
        "scheduler": schedulers[t.schedule](**scheduler_kwargs),
        "max_grad_norm": t.max_grad_norm,
        "z_loss_multiplier": t.z_loss,
        "compile_model": bool(t.compile and plan.world.device == "cuda"),
    }
    if t.activation_checkpointing:
        kwargs["ac_config"] = TransformerActivationCheckpointingConfig(
            mode=TransformerActivationCheckpointingMode(t.activation_checkpointing))
    for kind, group in APPLY_ORDER:
        for name, cfg in getattr(run, group).items():
            apply = getattr(reg.get(kind, name), "apply_train_module", None)
            if apply is not None:
                apply(cfg, kwargs, plan)
    return kwargs


def build_trainer(plan: Plan, run: Any, reg: Any, model: Any) -> Any:
    """Train module, data loader and Trainer for the plan (call inside the distributed env)."""
    from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.train import Duration, LoadStrategy, TrainerConfig
    from olmo_core.train.callbacks import CheckpointerCallback, ConsoleLoggerCallback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    from olmx.build.callbacks import OlmxMetricsCallback
    from olmx.build.data import token_files

    t, run_dir = run.trainer, Path(plan.run_dir)
    train_module = TransformerTrainModuleConfig(**train_module_kwargs(plan, run, reg)).build(model)

    tok = run.data.tokenizer
    tokenizer = TokenizerConfig(vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
                                bos_token_id=tok.bos_id, identifier=tok.name)
    dataset = NumpyFSLDatasetConfig(tokenizer=tokenizer, paths=token_files(run.data),
                                    sequence_length=plan.batch.seq_len,
                                    work_dir=str(run_dir / "work" / "dataset")).build()
    data_loader = NumpyDataLoaderConfig(
        global_batch_size=plan.batch.global_tokens, seed=t.seed, num_workers=run.data.num_workers,
        work_dir=str(run_dir / "work" / "loader"),
    ).build(dataset, dp_process_group=train_module.dp_process_group)

    callbacks = {
        # Synchronous saves: OLMo-core 3.0.0's async save deadlocks multi-process runs
        # (research note olmo-core-3.0.md §3.9).
        "checkpointer": CheckpointerCallback(save_interval=t.save_interval, save_async=False,
                                             pre_train_checkpoint=False),
        "console_logger": ConsoleLoggerCallback(log_interval=max(t.log_interval, 10)),
        "olmx_metrics": OlmxMetricsCallback(run_dir=str(run_dir), tokens_per_step=plan.batch.global_tokens,
                                            world_size=plan.world.size, resumed_from=plan.resume_step),
    }
    return TrainerConfig(
        save_folder=str(run_dir / CHECKPOINTS),
        work_dir=str(run_dir / "work"),
        load_strategy=LoadStrategy.if_available if t.resume else LoadStrategy.never,
        save_overwrite=True,
        max_duration=Duration.steps(t.max_steps),
        hard_stop=Duration.steps(t.stop_at_step) if t.stop_at_step else None,
        metrics_collect_interval=t.log_interval,
        cancel_check_interval=10,
        callbacks=callbacks,
    ).build(train_module, data_loader)


def reset_run_dir(run_dir: str) -> None:
    """``trainer.resume=false``: remove earlier checkpoints and metrics of this run dir."""
    from olmx.build.callbacks import truncate_metrics

    shutil.rmtree(Path(run_dir) / CHECKPOINTS, ignore_errors=True)
    truncate_metrics(run_dir, None)
