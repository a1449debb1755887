"""A run's model, loaded from one of its checkpoints into one process on this machine: what
``olmx generate`` and ``olmx export`` share.

The caller hands it the run's saved configuration resolved again for one process
(:func:`olmx.plan.resolve.local_plan`: the default infra target with one process, no parallel
plugins, the run's layers and precision), so the model is built exactly as training builds it
(:func:`olmx.worker.model.build_model`, then OLMo-core's train module, which initialises and
places it). The checkpoint (the newest complete one, or a chosen
step, verified against its olmx manifest) is loaded into it with OLMo-core's
``load_model_and_optim_state``: distributed checkpoints reshard, so a run trained on many ranks,
FSDP or sharded Engram tables included, loads into the one process.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError


def choose_checkpoint(run_dir: str | Path, step: int | None) -> Path:
    """``checkpoints/stepN``: ``step``, or the newest complete one; it must verify against its
    olmx manifest."""
    from olmx.rundir import RunDir

    rd = RunDir(run_dir)
    if step is None:
        step = rd.latest_checkpoint()
        if step is None:
            raise ConfigError("RUN_DIR", f"{rd.path} has no complete checkpoint (checkpoints/stepN)")
    ckpt = rd.checkpoints / f"step{step}"
    if not (ckpt / ".metadata.json").is_file():
        have = sorted(int(p.name[4:]) for p in rd.checkpoints.glob("step*") if p.name[4:].isdigit())
        raise ConfigError("--step", f"{ckpt} is not a complete checkpoint; complete ones: {have or 'none'}")
    return ckpt


def verified_checkpoint(run_dir: str | Path, step: int | None) -> Path:
    """:func:`choose_checkpoint`, then its check against the olmx manifest (a ConfigError
    naming ``--step`` says what does not verify)."""
    from olmx.worker.checkpoint import verify

    ckpt = choose_checkpoint(run_dir, step)
    problem = verify(ckpt)
    if problem:
        raise ConfigError("--step", f"{ckpt} does not verify against its manifest: {problem}")
    return ckpt


def load_model(plan: Any, reg: Any, ckpt: Path, *, keep_windows: bool = False) -> Any:
    """The model of ``plan``, built and placed as training does, with the checkpoint's weights
    (call inside :class:`one_process`); ``keep_windows``: every sliding window as configured
    (see :func:`olmx.worker.model.build_model`)."""
    from olmo_core.distributed.checkpoint import load_model_and_optim_state

    from olmx.worker.model import build_model
    from olmx.worker.train import train_module_config

    model = build_model(plan, reg, keep_windows=keep_windows)
    train_module = train_module_config(plan, reg).build(model)
    with tempfile.TemporaryDirectory(prefix="olmx-load-") as work:
        load_model_and_optim_state(str(ckpt / "model_and_optim"), train_module.model, work_dir=work)
    return train_module.model


class one_process:
    """torch.distributed with one process (gloo, or NCCL and gloo on a GPU) on a free local
    port, for what expects a process group (OLMo-core's train module, sharded Engram tables)."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        import torch
        import torch.distributed as dist

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
        env |= {"LOCAL_WORLD_SIZE": "1", "OLMO_SHARED_FS": "1", "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1"}
        self.saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        cuda = self.plan.world.device == "cuda"
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=0, world_size=1)

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
