"""olmx's trainer callbacks: ``metrics.jsonl`` and ``summary.json`` in the run directory, and
OLMo-core's speed monitor with olmx's peak FLOP/s table.

Rank 0 appends one JSON object per logged step: ``step``, ``time``, and every metric of the step
under the run's name for it (:func:`olmx.metrics.canonical`, the names every first-party tracker
records too): ``loss``, ``lr``, ``tokens``, ``tokens_per_s`` (over the last :data:`WINDOW_STEPS`
steps, so start-up, compilation and recompiles leave it once they are out of the window),
``tokens_per_s_per_process``, ``flops_per_s_per_device``, ``mfu`` (OLMo-core's, per step, against
:func:`olmx.launch.devices.peak_flops` for the run's compute dtype; absent where olmx does not
know the device), ``peak_mem_mib`` (:func:`peak_memory_mib`: allocator peak on CUDA, resident-set
high-water mark on CPU), ``reserved_mem_mib`` (CUDA), and OLMo-core's other metrics under its
names (``train/Z loss``, ``optim/total grad norm``, ...); the first ten are always there (null
where unknown). A step skipped for a non-finite loss has ``loss: null`` and ``skipped: true``; an
evaluated step adds ``eval/loss`` and ``eval/perplexity`` (OLMo-core's evaluator, over the
positions with a target: :class:`olmx.worker.datasets.HeldOutLMEvaluator`) and the downstream
tasks' metrics. The launcher follows that file to draw its progress bar. At the end (also when
the run stops early on a signal or a non-finite loss) every rank's throughput and peak memory
(with what it measures, :func:`memory_measure`, and on CPU the resident set before the model was
built) are gathered into ``summary.json``, with how the run ended and its goodput
(:func:`olmx.goodput.account`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo_core.train.callbacks import Callback, ProfilerCallback, SpeedMonitorCallback

from olmx import metrics as names
from olmx.goodput import account
from olmx.rundir import RunDir
from olmx.writable import write_text_atomic

log = logging.getLogger(__name__)


def peak_memory_mib(device: Any) -> float:
    """Peak memory of this process (:func:`memory_measure` says which): CUDA allocator peak on
    GPU, resident-set high-water mark on CPU."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return rss_mib()


def memory_measure(device_type: str) -> str:
    """What :func:`peak_memory_mib` measures on a device of ``device_type``: ``allocator peak``
    (CUDA: live tensors, what the plan's estimate counts) or ``process RSS`` (CPU: everything
    the process holds, the interpreter, torch and OLMo-core and freed blocks the heap kept
    included)."""
    return "allocator peak" if device_type == "cuda" else "process RSS"


def rss_mib() -> float:
    """This process's resident-set high-water mark so far, MiB."""
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
    #: CPU: the resident set (MiB) before the model was built (the interpreter, torch,
    #: OLMo-core, the data), which the report subtracts to compare with the plan's estimate.
    base_rss_mib: float | None = None
    #: The newest step's record, until its last flush is in (rank 0).
    _held: dict[str, Any] | None = field(default=None, repr=False)
    #: Where the newest step's line starts in metrics.jsonl (None: not written yet).
    _held_at: int | None = field(default=None, repr=False)
    #: ``(step, time)`` at the end of the last :data:`WINDOW_STEPS` + 1 steps.
    _ends: deque = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS + 1), repr=False)

    def pre_train(self) -> None:
        """Start the clock."""
        self._ends.clear()

    def post_step(self) -> None:
        """Time the step; record peak memory and throughput, under the run's names, for every
        callback (metrics.jsonl and the trackers alike)."""
        from olmo_core.train.common import ReduceType

        self._ends.append((self.step, time.perf_counter()))
        record = self.trainer.record_metric
        record(names.PEAK_MEMORY, peak_memory_mib(self.trainer.device), reduce_type=ReduceType.max)
        reserved = reserved_memory_mib(self.trainer.device)
        if reserved is not None:
            record(names.RESERVED_MEMORY, reserved, reduce_type=ReduceType.max)
        record(names.TOKENS, float(self.step * self.tokens_per_step), reduce_type=ReduceType.max)
        tps = self._tokens_per_s()
        if tps is not None:  # rank 0's clock (every rank's agrees but for noise)
            record(names.TOKENS_PER_S, tps, reduce_type=ReduceType.max)
            record(names.TOKENS_PER_S_PER_PROCESS, tps / self.world_size, reduce_type=ReduceType.max)

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
        """Write the step's record under the run's names (rank 0 only), at once: the launcher's
        progress and a run killed mid-way see every step that finished. A step's metrics can
        arrive in two flushes (a checkpoint step: the second has what was recorded after the
        save); the second replaces the step's line with the merged record."""
        from olmo_core.distributed.utils import get_rank

        if get_rank() != 0:
            return
        named = names.canonical(metrics)
        if self._held is not None and self._held["step"] == step:
            self._held.update(named)
        else:
            self._held, self._held_at = {"step": step, **named, "time": time.time()}, None
        self._write_held()

    def _write_held(self) -> None:
        """Write the held step's record, if it has a loss, a skip or an evaluation: appended, or
        in place of its earlier line (written at offset ``_held_at``)."""
        held = self._held
        if held is None:
            return
        step = held["step"]
        # 1.0 on a non-finite step; a reduction of metrics that differ between ranks (a pipeline's)
        # reports a step without it as -inf (the identity of its max)
        skipped = held.get(names.NONFINITE_STEP, 0.0) > 0
        evaluated = any(k.startswith("eval/") for k in held)
        if names.LOSS not in held and not skipped and not evaluated:
            return
        always = [names.LOSS, names.LR, names.TOKENS, names.TOKENS_PER_S, names.TOKENS_PER_S_PER_PROCESS]
        always += [names.FLOPS_PER_S, names.MFU, names.PEAK_MEMORY]
        # JSON has no inf or nan: a non-finite value is null (a pipeline's reduction reports an
        # unrecorded max as -inf; the trackers keep the number)
        finite = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in held.items()}
        record: dict[str, Any] = {"step": step, **dict.fromkeys(always), **finite}
        record[names.TOKENS] = step * self.tokens_per_step
        record["time"] = record.pop("time")  # last, as before
        if skipped:
            record[names.LOSS] = None
            record["skipped"] = True
        with open(RunDir(self.run_dir).metrics, "a+b") as f:
            if self._held_at is not None:
                f.truncate(self._held_at)
            f.seek(0, 2)
            self._held_at = f.tell()
            f.write((json.dumps(record) + "\n").encode())

    def post_train(self) -> None:
        """Gather every process's throughput and peak memory into summary.json (read
        with every step's record from metrics.jsonl)."""
        import torch.distributed as dist

        tps = self._tokens_per_s()
        mine = {
            "rank": int(os.environ.get("RANK", 0)),
            "tokens_per_s": tps / self.world_size if tps else None,
            names.PEAK_MEMORY: peak_memory_mib(self.trainer.device),
            "memory_measure": memory_measure(self.trainer.device.type),
            "base_rss_mib": self.base_rss_mib,
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
        losses = [r[names.LOSS] for r in records if r.get(names.LOSS) is not None]
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
            "goodput": account(self.run_dir),
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
