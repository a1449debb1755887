"""``olmx run PLAN.yaml``: what every launched process runs.

Reads the saved plan (never composes config), sets up torch.distributed through OLMo-core,
builds the model (layer plugins applied before parallelism), the train module (parallel and
precision plugins applied) and the Trainer, resumes from the newest checkpoint that verifies
(:mod:`olmx.worker.checkpoint`) or, on a fresh start, loads ``model.init_from``'s Hugging Face
weights (:mod:`olmx.worker.hf`), and trains. A stop signal or a non-finite step ends the run
with a checkpoint (:mod:`olmx.worker.faults`); how it ended goes to ``events.jsonl``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from olmx.launch import SHARE_CORES_ENV
from olmx.plan import Plan
from olmx.rundir import RunDir


def share_cores(procs_per_node: int, environ: dict[str, str], cores: int | None = None) -> tuple[int, str]:
    """This worker's thread count and where it comes from: the user's ``OMP_NUM_THREADS``
    where they set it (kept), else ``cores / local processes`` (at least 1), so that processes
    on one machine do not fight over its cores. The user's setting is one a launcher did not
    mark as left to olmx (:func:`olmx.launch.threads_env`: torchrun sets 1 where it is unset)."""
    value = environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0 and environ.get(SHARE_CORES_ENV) != "1":
        return int(value), "OMP_NUM_THREADS set by the user"
    cores = cores or os.cpu_count() or 1
    return max(1, cores // procs_per_node), f"{cores} cores / {procs_per_node} local processes"


def _set_threads(procs_per_node: int) -> str:
    """Apply :func:`share_cores` (before OLMo-core's set-up, which would otherwise say it keeps
    an ``OMP_NUM_THREADS`` of '8': its own default, printed as if it were the value it found)."""
    import logging

    import torch

    threads, source = share_cores(procs_per_node, dict(os.environ))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    skip = "Will skip setting env var 'OMP_NUM_THREADS'"
    logging.getLogger("olmo_core.utils").addFilter(lambda r: not str(r.msg).startswith(skip))
    return f"{threads} thread(s) per process ({source})"


def restart_attempt() -> int:
    """Which torchrun attempt this is (0: the first; >0 after an elastic restart)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def run_worker(plan_path: str | Path) -> None:
    """Train one process's share of the plan; exits with 75 when stopped by a signal and 76 when
    stopped on a non-finite loss (both after saving a checkpoint), see :mod:`olmx.events`.

    Per-rank Python errors are recorded in torchrun's error file (``record``), where the
    launcher reads which rank failed and why. Under torchrun, the death of torchrun (even by
    SIGKILL) arrives as SIGTERM (Linux parent-death signal): the ranks stop with a checkpoint
    instead of training on as orphans."""
    from olmx.stop import die_with_parent, install_stop_handlers

    install_stop_handlers()  # first: a preemption notice during start-up is kept, not fatal
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun (its main thread)
        import signal

        die_with_parent(signal.SIGTERM)
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(_run)(plan_path)
    if code:
        raise SystemExit(code)


#: Entries the NCCL Flight Recorder keeps per rank (torchtitan's default ``trace_buf_size``).
FLIGHT_RECORDER_ENTRIES = 20000


def flight_recorder_env(hang_dir: str | Path) -> dict[str, str]:
    """The NCCL Flight Recorder, on (as torchtitan has it by default): it records every rank's
    recent collectives, dumped by NCCL's own timeout into ``hang_dir`` and by olmx's hang
    watchdog next to its verdict (:mod:`olmx.worker.watchdog`). Set under both the names of
    torch 2.11 (``TORCH_NCCL_*``) and of later releases (``TORCH_FR_*``)."""
    prefix = str(Path(hang_dir) / "nccl_trace_rank_")
    entries = str(FLIGHT_RECORDER_ENTRIES)
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": entries,
        "TORCH_FR_BUFFER_SIZE": entries,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
    }


def process_group_timeout(hang_timeout: int) -> Any:
    """The process group's collective timeout: OLMo-core's 15 minutes, or more where the hang
    watchdog waits long enough that gloo or NCCL would otherwise end the ranks first (with a
    lost-peer error that names nobody)."""
    from datetime import timedelta

    return timedelta(seconds=max(15 * 60, 2 * hang_timeout + 60))


def worker_environment(device: str, environ: dict[str, str], hang_dir: str | Path = "hang") -> dict[str, str]:
    """The variables the worker sets before OLMo-core and the CUDA allocator start (each only
    where the user has not set it): the run directory is on a shared filesystem as far as
    OLMo-core knows (one process writes what all share); on CUDA, the caching allocator's
    expandable segments (as OLMo-core's own launch presets set them: less fragmentation, so
    fewer out-of-memory errors at high occupancy) and the NCCL Flight Recorder
    (:func:`flight_recorder_env`, dumps into ``hang_dir``); on CPUs, no per-rank Triton cache folder
    (OLMo-core makes one per rank and job under ``/tmp`` because ranks race on Triton's
    autotune files; CPU workers compile no Triton kernels, so they would only leave empty
    folders behind). GPU workers keep OLMo-core's per-rank cache."""
    out = {"OLMO_SHARED_FS": "1"}
    if device == "cuda":
        if "PYTORCH_ALLOC_CONF" not in environ and "PYTORCH_CUDA_ALLOC_CONF" not in environ:
            out["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        out.update(flight_recorder_env(hang_dir))
    else:
        out["OLMO_DISABLE_PER_RANK_TRITON_CACHE"] = "1"
    return {k: v for k, v in out.items() if k not in environ}


def _run(plan_path: str | Path) -> int:
    from olmx.registry import registry

    reg = registry()
    plan = Plan.load(plan_path, reg)  # torch-free: nothing has read the variables below yet
    hang_dir = RunDir(plan.run_dir).hang
    os.environ.update(worker_environment(plan.world.device, dict(os.environ), hang_dir))
    run = plan.run

    from olmo_core.distributed.utils import barrier, get_rank, get_world_size
    from olmo_core.train import prepare_training_environment, teardown_training_environment

    from olmx.events import append_event
    from olmx.worker.callbacks import truncate_metrics
    from olmx.worker.checkpoint import check_disk_space, no_space_error, resume_from_verified
    from olmx.worker.faults import agree_stop
    from olmx.worker.model import build_model
    from olmx.worker.train import build_trainer, reset_run_dir

    backend = "gloo" if plan.world.device == "cpu" else "cpu:gloo,cuda:nccl"
    threads = _set_threads(plan.world.nproc_per_node)
    prepare_training_environment(
        seed=run.trainer.seed,
        backend=backend,
        timeout=process_group_timeout(plan.execution.hang_timeout),
        shared_filesystem=True,
    )
    if get_rank() == 0:
        import logging

        logging.getLogger(__name__).info(threads)
    from olmx.worker.callbacks import rss_mib

    base_rss = rss_mib() if plan.world.device == "cpu" else None  # before the model: torch, OLMo-core
    try:
        attempt, rank0 = restart_attempt(), get_rank() == 0
        fresh = not run.trainer.resume and attempt == 0  # an elastic restart always resumes
        if rank0 and fresh:
            reset_run_dir(plan.run_dir)
        barrier()
        model = build_model(plan, reg)
        check_disk_space(model, plan.run_dir)
        trainer = build_trainer(plan, reg, model, attempt=attempt)
        step = None if fresh else resume_from_verified(trainer, plan.run_dir)
        initialised_from = None
        if step is None and run.model.init_from:  # a fresh start (a resume has its checkpoint's weights)
            from olmx.worker.hf import load_init_from

            initialised_from = load_init_from(trainer.train_module.model, plan)
        trainer.callbacks["olmx_metrics"].resumed_from = step
        trainer.callbacks["olmx_clock"].resumed_from = step
        trainer.callbacks["olmx_metrics"].base_rss_mib = base_rss
        if rank0:
            truncate_metrics(plan.run_dir, step)
            more = {"init_from": initialised_from} if initialised_from else {}
            append_event(plan.run_dir, "start", attempt=attempt, resumed_from=step, world_size=get_world_size(), **more)
        guard = trainer.callbacks["olmx_guard"]
        end = min(run.trainer.max_steps, run.trainer.stop_at_step or run.trainer.max_steps)
        if signum := agree_stop():  # stopped before the first step: the latest checkpoint stands
            import signal

            guard.stop_reason = signal.Signals(signum).name
        elif step is None or step < end:  # (fit would only save the loaded checkpoint again)
            try:
                trainer.fit()
            except BaseException as exc:  # torch DCP's CheckpointException is a BaseException
                if (err := no_space_error(exc)) is None:
                    raise
                return _no_space(plan, trainer, err, rank0)
        return _finish(plan, run, trainer, guard.stop_reason, rank0)
    finally:
        teardown_training_environment()


def _no_space(plan: Plan, trainer: Any, err: OSError, rank0: bool) -> int:
    """A checkpoint could not be written for want of space (every rank raised it together,
    :mod:`olmx.worker.checkpoint`): rank 0 removes the partial save, records a ``nospace`` end
    naming the failed step and the newest published checkpoint, and the worker exits with
    ``EXIT_PREEMPTED`` (75): the run is stopped and resumes from that checkpoint once there is
    space (olmx train checks for space before it trains again)."""
    import logging
    import shutil

    from olmx.events import EXIT_PREEMPTED, append_event
    from olmx.worker.checkpoint import checkpoint_dirs

    folder = RunDir(plan.run_dir).checkpoints
    if rank0:
        complete, partial = checkpoint_dirs(folder)
        for p in partial:
            shutil.rmtree(p, ignore_errors=True)
        logging.getLogger(__name__).error(f"checkpoint step {trainer.global_step} could not be written: {err}")
        append_event(
            plan.run_dir,
            "end",
            reason="nospace",
            step=complete[0][0] if complete else None,
            failed_step=trainer.global_step,
            error=err.strerror or str(err),
            folder=str(folder),
        )
    return EXIT_PREEMPTED


def _finish(plan: Plan, run: Any, trainer: Any, stop_reason: str | None, rank0: bool) -> int:
    """Record how the run ended; the worker's exit code."""
    from olmx.events import EXIT_NONFINITE, EXIT_PREEMPTED, append_event

    step = trainer.global_step
    if stop_reason != "nonfinite" and step >= run.trainer.max_steps:
        stop_reason = None  # the signal came with the last step: the run is complete
    if stop_reason is None:
        reason, code = ("max_steps" if step >= run.trainer.max_steps else "stop_at_step"), 0
    else:
        reason, code = stop_reason, (EXIT_NONFINITE if stop_reason == "nonfinite" else EXIT_PREEMPTED)
    if rank0:
        append_event(plan.run_dir, "end", reason=reason, step=step)
    return code
