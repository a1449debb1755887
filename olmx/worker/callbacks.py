"""olmx's trainer callback: ``metrics.jsonl`` and ``summary.json`` in the run directory.

Rank 0 appends one JSON object per logged step (``step``, ``loss``, ``lr``, ``tokens``,
``tokens_per_s``, ``tokens_per_s_per_process``, ``flops_per_s_per_device``, ``mfu`` (OLMo-core's,
where it knows the device), ``peak_mem_mib``, ``time``; a step skipped for a non-finite loss
has ``loss: null`` and ``skipped: true``; an evaluated step adds ``eval/loss`` and
``eval/perplexity``, from OLMo-core's evaluator: :func:`olmx.worker.datasets.eval_record`); the
launcher follows that file to draw its progress bar. At the end (also when the run stops early
on a signal or a non-finite loss) every rank's throughput and peak memory are gathered into
``summary.json``, with how the run ended.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo_core.train.callbacks import Callback

from olmx.rundir import RunDir
from olmx.worker.datasets import eval_record


def peak_memory_mib(device: Any) -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    #: Tokens per sequence (for the evaluator's loss, :func:`olmx.worker.datasets.eval_record`).
    seq_len: int = 2
    _t0: float | None = field(default=None, repr=False)
    _step0: int = field(default=0, repr=False)
    _last_time: float = field(default=0.0, repr=False)

    def pre_train(self) -> None:
        """Start the clocks."""
        self._t0 = None
        self._step0 = self.step

    def post_step(self) -> None:
        """Time steps (from the end of the first one, to skip warm-up) and record peak memory."""
        from olmo_core.train.common import ReduceType

        now = time.perf_counter()
        if self._t0 is None:
            self._t0, self._step0 = now, self.step
        self._last_time = now
        self.trainer.record_metric(
            "system/peak memory (MiB)", peak_memory_mib(self.trainer.device), reduce_type=ReduceType.max
        )

    def _tokens_per_s(self) -> float | None:
        steps = self.step - self._step0
        if self._t0 is None or steps <= 0 or self._last_time <= self._t0:
            return None
        return steps * self.tokens_per_step / (self._last_time - self._t0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Append the step's record (rank 0 only)."""
        from olmo_core.distributed.utils import get_rank

        skipped = bool(metrics.get("olmx/non-finite step"))
        evaluated = eval_record(metrics, self.seq_len)
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
        final = RunDir(self.run_dir).summary
        tmp = final.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(final)
