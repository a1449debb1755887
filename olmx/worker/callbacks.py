"""olmx's trainer callbacks: ``metrics.jsonl`` and ``summary.json`` in the run directory, and
OLMo-core's speed monitor with olmx's peak FLOP/s table.

Rank 0 appends one JSON object per logged step (``step``, ``loss``, ``lr``, ``tokens``,
``tokens_per_s`` (over the last :data:`WINDOW_STEPS` steps, so start-up, compilation and
recompiles leave it once they are out of the window), ``tokens_per_s_per_process``,
``flops_per_s_per_device``, ``mfu`` (OLMo-core's, per step, against :func:`olmx.launch.devices.peak_flops`
for the run's compute dtype; absent where olmx does not know the device), ``peak_mem_mib``,
``reserved_mem_mib`` (CUDA), ``time``; a step skipped for a non-finite loss
has ``loss: null`` and ``skipped: true``; an evaluated step adds ``eval/loss`` and
``eval/perplexity``, from OLMo-core's evaluator: :func:`olmx.worker.datasets.eval_record`); the
launcher follows that file to draw its progress bar. At the end (also when the run stops early
on a signal or a non-finite loss) every rank's throughput and peak memory are gathered into
``summary.json``, with how the run ended.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo_core.train.callbacks import Callback, ProfilerCallback, SpeedMonitorCallback

from olmx.rundir import RunDir
from olmx.worker.datasets import eval_record
from olmx.writable import write_text_atomic

log = logging.getLogger(__name__)


def peak_memory_mib(device: Any) -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reserved_memory_mib(device: Any) -> float | None:
    """Peak memory the CUDA caching allocator reserved (what ``nvidia-smi`` shows, minus the
    CUDA context); None on CPU."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2**20
    return None


#: Steps over which ``tokens_per_s`` is measured: recent enough to follow the run, long enough
#: to average out one slow step (a checkpoint, an evaluation, a recompile).
WINDOW_STEPS = 20


@dataclass
class OlmxSpeedMonitorCallback(SpeedMonitorCallback):
    """OLMo-core's speed monitor (``throughput/device/*`` metrics, MFU) with the device's peak
    from olmx's table (:data:`olmx.launch.devices.PEAK_FLOPS`) for the run's compute dtype.
    OLMo-core 3.0.0's own table knows H100, B200/B300 and RTX PRO 6000 and takes every other
    GPU for an A100, so an H200 read ~3x its real MFU; here an unknown device reports no MFU
    rather than a wrong one."""

    #: The run's compute dtype (``plan.dtypes.param``).
    compute_dtype: str = "bfloat16"

    def pre_train(self) -> None:
        """OLMo-core's set-up, then olmx's peak."""
        super().pre_train()
        if self.trainer.device.type == "cuda":
            import torch

            from olmx.hardware import peak_flops

            peak = peak_flops(torch.cuda.get_device_name(self.trainer.device), self.compute_dtype)
            self.device_peak_flops_per_second = int(peak) if peak else None


def truncate_metrics(run_dir: str | Path, last_step: int | None) -> None:
    """Drop records after ``last_step`` (None: all), so a resumed run continues the file."""
    path = RunDir(run_dir).metrics
    if not path.exists():
        return
    keep = []
    if last_step is not None:
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= last_step:
                    keep.append(line)
            except (ValueError, KeyError):
                break
    path.write_text("".join(f"{line}\n" for line in keep))


@dataclass
class OlmxMetricsCallback(Callback):
    """Writes metrics.jsonl / summary.json (rank 0) and measures per-process throughput."""

    run_dir: str = ""
    tokens_per_step: int = 0
    world_size: int = 1
    resumed_from: int | None = None
    #: ``(step, time)`` at the end of the last :data:`WINDOW_STEPS` + 1 steps.
    _ends: deque = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS + 1), repr=False)

    def pre_train(self) -> None:
        """Start the clock."""
        self._ends.clear()

    def post_step(self) -> None:
        """Time the step and record peak memory."""
        from olmo_core.train.common import ReduceType

        self._ends.append((self.step, time.perf_counter()))
        self.trainer.record_metric(
            "system/peak memory (MiB)", peak_memory_mib(self.trainer.device), reduce_type=ReduceType.max
        )
        reserved = reserved_memory_mib(self.trainer.device)
        if reserved is not None:
            self.trainer.record_metric("system/reserved memory (MiB)", reserved, reduce_type=ReduceType.max)

    def _tokens_per_s(self) -> float | None:
        """Tokens per second over the window: the steps that ended after its first step's end
        (so the first step of a run or a resume, start-up included, never counts)."""
        if len(self._ends) < 2:
            return None
        (first_step, first), (last_step, last) = self._ends[0], self._ends[-1]
        if last_step <= first_step or last <= first:
            return None
        return (last_step - first_step) * self.tokens_per_step / (last - first)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Append the step's record (rank 0 only)."""
        from olmo_core.distributed.utils import get_rank

        # 1.0 on a non-finite step; a reduction of metrics that differ between ranks (a pipeline's)
        # reports a step without it as -inf (the identity of its max)
        skipped = metrics.get("olmx/non-finite step", 0.0) > 0
        evaluated = eval_record(metrics)
        if get_rank() != 0 or ("train/CE loss" not in metrics and not skipped and not evaluated):
            return
        tps = self._tokens_per_s()
        record = {
            "step": step,
            "loss": metrics.get("train/CE loss"),
            "lr": metrics.get("optim/LR (group 0)"),
            "tokens": step * self.tokens_per_step,
            "tokens_per_s": tps,
            "tokens_per_s_per_process": tps / self.world_size if tps else None,
            "flops_per_s_per_device": metrics.get("throughput/device/flopsPS"),
            "mfu": metrics.get("throughput/device/MFU"),
            "peak_mem_mib": metrics.get("system/peak memory (MiB)"),
            "time": time.time(),
        }
        if "system/reserved memory (MiB)" in metrics:
            record["reserved_mem_mib"] = metrics["system/reserved memory (MiB)"]
        if skipped:
            record["skipped"] = True
        record.update(evaluated)
        with open(RunDir(self.run_dir).metrics, "a") as f:
            f.write(json.dumps(record) + "\n")

    def post_train(self) -> None:
        """Gather every process's throughput and peak memory into summary.json."""
        import torch.distributed as dist

        tps = self._tokens_per_s()
        mine = {
            "rank": int(os.environ.get("RANK", 0)),
            "tokens_per_s": tps / self.world_size if tps else None,
            "peak_mem_mib": peak_memory_mib(self.trainer.device),
        }
        everyone = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()  # type: ignore[list-item]
            dist.all_gather_object(everyone, mine)
        if mine["rank"] != 0:
            return
        records = []
        path = RunDir(self.run_dir).metrics
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        losses = [r["loss"] for r in records if r.get("loss") is not None]
        guard = self.trainer.callbacks.get("olmx_guard")
        summary = {
            "steps": self.step,
            "tokens": self.step * self.tokens_per_step,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "best_loss": min(losses) if losses else None,
            "processes": everyone,
            "resumed_from": self.resumed_from,
            "stopped": getattr(guard, "stop_reason", None),
            "nonfinite_steps": list(getattr(guard, "nonfinite_steps", [])),
            "run_dir": self.run_dir,
        }
        write_text_atomic(RunDir(self.run_dir).summary, json.dumps(summary, indent=2))


@dataclass
class RunDirProfilerCallback(ProfilerCallback):
    """OLMo-core's ``ProfilerCallback`` (rank 0) tracing steps ``first``..``last`` into
    ``RUN_DIR/profile/rank0-steps-FIRST-LAST.chrome_trace.json.gz``.

    OLMo-core steps its ``torch.profiler`` schedule when each batch after the first is loaded,
    so step ``k`` runs at schedule index ``k - 1``; ``wait = first - 2`` and one warm-up step
    make ``first`` the first traced step. The window is closed right after ``last`` (OLMo-core
    would close it when the next batch is loaded, which never comes when ``last`` ends the
    run), and the trace goes to the run directory (OLMo-core writes it under its work
    directory and copies it to the checkpoint folder)."""

    #: The first traced step.
    first: int = 2
    #: The last traced step.
    last: int = 2
    #: Where the trace is written (``RUN_DIR/profile``).
    out_dir: str = ""

    def __post_init__(self) -> None:
        self.skip_first, self.wait, self.warmup = 0, self.first - 2, 1
        self.active, self.repeat = self.last - self.first + 1, 1

    def post_train_batch(self) -> None:
        """End the traced window with its last step."""
        if self._profiler is not None and self.step == self.last:
            self._profiler.step()

    def _on_trace_ready(self, prof: Any) -> None:
        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"rank0-steps-{self.first}-{self.last}.chrome_trace.json.gz"
        tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")  # ends in .gz: torch gzips by the name
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        log.info(f"profile of steps {self.first}-{self.last} written to {path}; by CPU time:\n{table}")

    def close(self) -> None:
        """Stop the profiler however the run ends."""
        stack = self.__dict__.pop("_exit_stack", None)  # set by OLMo-core's pre_train on rank 0
        if stack is not None:
            stack.close()


def profile_callbacks(t: Any, out_dir: Path) -> dict[str, Callback]:
    """``trainer.profile``'s callbacks: the trace, and with ``trainer.memory_snapshot`` OLMo-core's
    CUDA memory history over the same steps (rank 0)."""
    if not t.profile:
        return {}
    first, last = t.profile_start, t.profile_start + t.profile_steps - 1
    out: dict[str, Callback] = {"profiler": RunDirProfilerCallback(first=first, last=last, out_dir=str(out_dir))}
    if t.memory_snapshot:
        from olmo_core.train.callbacks import TorchMemoryHistoryCallback

        out["memory_snapshot"] = TorchMemoryHistoryCallback(start=first, end=last, output_dir=str(out_dir))
    return out
