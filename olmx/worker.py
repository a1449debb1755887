"""``olmx run PLAN.yaml``: what every launched process runs.

Reads the saved plan (never composes config), sets up torch.distributed through OLMo-core,
builds the model (layer plugins applied before parallelism), the train module (parallel and
precision plugins applied) and the Trainer, and trains.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from olmx.plan import Plan


def typed_config(plan: Plan, reg: Any) -> Any:
    """The typed RunConfig of a saved plan (plugin sections re-typed by their Config)."""
    from omegaconf import OmegaConf

    from olmx.config.compose import to_object

    return to_object(OmegaConf.create(plan.config), reg)


def _share_cores(procs_per_node: int) -> None:
    """Give each CPU process its share of the cores (an inherited OMP_NUM_THREADS=8 on a
    2-core machine makes two processes fight over them)."""
    import torch

    threads = max(1, (os.cpu_count() or 1) // procs_per_node)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def run_worker(plan_path: str | Path) -> None:
    """Train one process's share of the plan."""
    os.environ.setdefault("OLMO_DISABLE_PER_RANK_TRITON_CACHE", "1")
    os.environ.setdefault("OLMO_SHARED_FS", "1")
    from olmx.registry import registry

    plan = Plan.load(plan_path)
    reg = registry()
    run = typed_config(plan, reg)

    from olmo_core.distributed.utils import barrier, get_rank
    from olmo_core.train import prepare_training_environment, teardown_training_environment

    from olmx.build.callbacks import truncate_metrics
    from olmx.build.model import build_model
    from olmx.build.train import build_trainer, reset_run_dir

    backend = "gloo" if plan.world.device == "cpu" else "cpu:gloo,cuda:nccl"
    if plan.world.device == "cpu":
        _share_cores(plan.world.nproc_per_node)
    prepare_training_environment(seed=run.trainer.seed, backend=backend, shared_filesystem=True)
    try:
        if get_rank() == 0:
            if run.trainer.resume:
                truncate_metrics(plan.run_dir, plan.resume_step)
            else:
                reset_run_dir(plan.run_dir)
        barrier()
        model = build_model(plan, run, reg)
        trainer = build_trainer(plan, run, reg, model)
        trainer.fit()
    finally:
        teardown_training_environment()
