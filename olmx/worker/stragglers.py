"""Stragglers: every rank's step time split into its own compute and its waiting in collectives.

In a synchronous step every rank's wall time is the slowest rank's: the others wait for it in
the collectives (the gradient all-reduce, FSDP's gathers). What tells them apart is the work a
rank did itself. On CPUs that is the process's CPU time over the step divided by its threads
(a rank waiting in gloo sleeps); the rest of the step's wall time is waiting. Each rank sums
both over the steps since the last metrics collection; at a collection (every
``trainer.log_interval`` steps, when the Trainer syncs anyway) one all-gather of two numbers
per rank gives every rank the whole picture, recorded as metrics (:mod:`olmx.metrics`): the
median step time, the median and largest compute time, the median waiting time, and the rank
with the most compute. :func:`olmx.goodput.straggler` reads them back to flag a rank
persistently slower than the median (``olmx report``, ``olmx runs``).

On CUDA the host's CPU time is not the device's work: there the split is not recorded (only
what the speed monitor measures); a per-rank device timer is left to do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from olmo_core.train.callbacks import Callback

from olmx import metrics as names


@dataclass
class StragglerWatch(Callback):
    """Per-rank compute and waiting (module doc), recorded at every metrics collection."""

    #: Right after the clock (:class:`olmx.worker.clock.Clock`): its marks bracket the step's work.
    priority: ClassVar[int] = 10**6 - 1
    #: Steps between metrics collections (the plan's ``execution.log_interval``).
    log_interval: int = 1
    _wall: float = 0.0
    _cpu: float = 0.0
    _step_sum: float = 0.0
    _compute_sum: float = 0.0
    _steps: int = 0

    def pre_step(self, batch: dict) -> None:
        """The step's work begins."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def post_train_batch(self) -> None:
        """The step's work ended (its optimizer step included): add it up; at a collection,
        gather every rank's sums and record them."""
        import torch

        wall = time.perf_counter() - self._wall
        compute = min(wall, (time.process_time() - self._cpu) / max(1, torch.get_num_threads()))
        self._step_sum += wall
        self._compute_sum += compute
        self._steps += 1
        if self.step % self.log_interval == 0:
            self._record()

    def _record(self) -> None:
        import torch
        import torch.distributed as dist

        mine = torch.tensor([self._step_sum / self._steps, self._compute_sum / self._steps], dtype=torch.float64)
        self._step_sum = self._compute_sum = 0.0
        self._steps = 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = self.trainer.device if self.trainer.device.type == "cuda" else torch.device("cpu")
            everyone = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, mine.to(device))
            per_rank = torch.stack(everyone).cpu()
        else:
            per_rank = mine[None]
        step, compute = per_rank[:, 0], per_rank[:, 1]
        wait = (step - compute).clamp(min=0)
        record = self.trainer.record_metric
        median = lambda x: torch.quantile(x, 0.5).item()  # noqa: E731 - of 2 ranks, their mean
        record(names.STEP_TIME, median(step), reduce_type=None)
        record(names.COMPUTE_MEDIAN, median(compute), reduce_type=None)
        record(names.COMPUTE_MAX, compute.max().item(), reduce_type=None)
        record(names.WAIT_MEDIAN, median(wait), reduce_type=None)
        record(names.SLOWEST_RANK, float(compute.argmax().item()), reduce_type=None)


def straggler_callbacks(device: str, log_interval: int) -> dict[str, Callback]:
    """The watch where the split means something (CPUs; module doc)."""
    return {} if device == "cuda" else {"olmx_stragglers": StragglerWatch(log_interval=log_interval)}
