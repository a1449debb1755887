"""Stopping cleanly on a signal, non-finite steps, and test-only fault injection.

**Signals.** OLMo-core 3.0.0's Trainer turns SIGTERM/SIGINT into a cancel request that ranks
exchange every ``cancel_check_interval`` steps in a bookkeeping thread (``trainer.py``,
``_check_if_canceled``): each rank sees the agreed flag whenever that thread finishes, so one
rank can stop while another is already in the next step's collectives. olmx installs handlers
that only set a flag (:func:`install_stop_handlers`, from the first line of the worker, so a
signal during start-up is kept) and :class:`TrainingGuard` all-reduces that flag synchronously,
before the optimizer step, every ``stop_check_interval`` steps and at the run's last step.
Every rank gets the same answer at the same step, finishes the step, and cancels with
``Trainer.cancel_run(no_sync=True)``; the checkpointer's ``post_train`` then saves that step.
The worker exits with ``EXIT_PREEMPTED`` (75).

**Non-finite loss or gradients.** Before every optimizer step the guard takes the global
gradient norm once (:func:`olmx.worker.clip.global_grad_norm`, the same on every rank); that
norm decides whether the step is non-finite (together with the loss), scales the gradients
(``trainer.max_grad_norm``) and feeds OLMo-core's ``SkipStepAdamW`` its rolling statistics. All
ranks act alike (``trainer.on_nonfinite``):

- ``skip``: the gradients are dropped (``zero_grad(set_to_none=True)``; AdamW leaves a
  parameter without a gradient, its moments and its step count untouched, so the optimizer
  step is a no-op), the step's ``train/*`` metrics are removed (OLMo-core raises on a
  non-finite loss when it logs it) and so is its loss from ``SkipStepAdamW``'s statistics,
  and the step is counted in the summary.
- ``stop``: the same, then the run stops as on a signal: the checkpoint saved at that step
  holds the parameters and optimizer state from before it (the bad batch is not applied, the
  data position is after it), and the worker exits with ``EXIT_NONFINITE`` (76).

Cost, beyond the norm that clipping takes anyway: one host read of the verdict per step. Under
``SkipStepAdamW`` (the default) OLMo-core has already all-reduced the loss and the norm is
global, so the verdict needs no collective; the stop signals are agreed with one all-reduce of
two integers every ``stop_check_interval`` steps (the plan's metrics cadence: every step on
CPUs, every 10 on CUDA, when the Trainer syncs anyway) and at the last step. With
``trainer.optimizer=adamw`` the loss is each rank's own, and the verdict is all-reduced every
step.

**Fault injection** (tests and ``benchmarks/soak.py`` only). ``OLMX_FAULTS`` in the worker's
environment is a comma-separated list of ``KIND@STEP`` or ``KIND@STEP:RANK`` (default rank 0;
``nan`` without a rank poisons every rank). Each fault fires once per run directory (a marker
file in ``RUN_DIR/work/faults/``), so a restarted or resumed run passes the step again safely.

- ``nan``: the input embeddings of that step's forward pass are multiplied by NaN (the loss
  and every gradient become NaN, the parameters are untouched);
- ``kill``: SIGKILL of the rank after its backward pass, before the optimizer step;
- ``term``: SIGTERM to the rank at the same point (a preemption notice reaching one rank);
- ``hold``: the rank waits there until a stop signal arrives (at most 120 s), so a test can
  send a real signal at a known step;
- ``killsave``: SIGKILL of the rank while saving that step's checkpoint, after its files are
  written and before it is verified and published;
- ``stop``: SIGSTOP of the rank after its backward pass (a wedged process: the hang watchdog's
  case, :mod:`olmx.worker.watchdog`);
- ``spin``: the rank loops in Python there for good (a rank that spins instead of stepping).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from olmo_core.train.callbacks import Callback

from olmx.events import append_event
from olmx.rundir import RunDir
from olmx.stop import install_stop_handlers, request_stop, stop_requested

log = logging.getLogger(__name__)

#: The environment variable of :func:`inject`.
FAULTS_ENV = "OLMX_FAULTS"
_fault_dir: Path | None = None


def agree_stop() -> int:
    """The stop signal any rank received (a collective; 0: none)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([stop_requested()], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


@dataclass
class TrainingGuard(Callback):
    """Before every optimizer step: the global gradient norm (once), the non-finite check,
    clipping, and the stop-signal agreement (module doc)."""

    #: Runs after every other callback's ``pre_optim_step`` (an injected fault comes first).
    priority: ClassVar[int] = -100

    #: ``stop`` or ``skip`` (``trainer.on_nonfinite``).
    on_nonfinite: str = "stop"
    run_dir: str = ""
    #: Clip gradients to this global norm (``trainer.max_grad_norm``; None: no clipping).
    max_grad_norm: float | None = None
    #: Agree on stop signals every this many steps (the plan's metrics cadence, when the
    #: Trainer syncs with the device anyway), and at the last step.
    stop_check_interval: int = 1
    #: The step this run ends at (``trainer.stop_at_step`` or ``trainer.max_steps``).
    last_step: int = 0
    #: Steps skipped or stopped at for a non-finite loss/gradient (kept in checkpoints).
    nonfinite_steps: list[int] = field(default_factory=list)
    #: Why the run is stopping early: a signal name or ``nonfinite`` (None: it is not).
    stop_reason: str | None = None

    def pre_train(self) -> None:
        """Take SIGTERM/SIGINT back from the handlers ``Trainer.fit`` just installed."""
        install_stop_handlers()
        if getattr(self.trainer, "_cancel_reason", None):  # a signal landed in OLMo-core's handler
            request_stop(signal.SIGTERM)

    def pre_optim_step(self) -> None:
        """The step's norm and verdict; on a good step clip and feed ``SkipStepAdamW``."""
        import torch
        import torch.distributed as dist
        from olmo_core.distributed.utils import get_local_tensor
        from olmo_core.optim import SkipStepOptimizer
        from olmo_core.train.common import TRAIN_CE_LOSS_METRIC

        from olmx.worker.clip import clip_grads_with_norm_, global_grad_norm

        module = self.trainer.train_module
        parts = getattr(module, "model_parts", None) or [module.model]
        optim = module.optimizers[0] if hasattr(module, "optimizers") else module.optim
        params = [p for part in parts for p in part.parameters() if p.grad is not None]
        norm = global_grad_norm(params, getattr(module, "pp_group", None))  # the same on every rank
        bad = ~torch.isfinite(norm)
        loss = self.trainer.get_metric(TRAIN_CE_LOSS_METRIC)
        if loss is not None:
            bad = bad | ~torch.isfinite(get_local_tensor(loss).to(norm.device)).all()
        # With a SkipStepOptimizer OLMo-core has already all-reduced the loss: the verdict is the
        # same on every rank without a collective. Otherwise the loss is this rank's own.
        loss_is_global = isinstance(optim, SkipStepOptimizer)
        check_stop = self.step % self.stop_check_interval == 0 or self.step >= self.last_step
        stop = stop_requested() if check_stop else 0
        if dist.is_available() and dist.is_initialized() and (check_stop or not loss_is_global):
            flags = torch.stack([torch.tensor(stop, device=norm.device), bad.long()])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            signum, bad_flag = flags.tolist()  # the step's one host sync (one copy of both flags)
            nonfinite = bool(bad_flag)
        else:
            signum, nonfinite = stop, bool(bad)  # the step's one host sync
        if nonfinite:
            self._drop_step(optim if loss_is_global else None)
        else:
            if self.max_grad_norm is not None:
                clip_grads_with_norm_(params, self.max_grad_norm, norm)
            # As OLMo-core's own clipping: already the global value, so no reduction.
            self.trainer.record_metric("total grad norm", norm, reduce_type=None, namespace="optim")
            if isinstance(optim, SkipStepOptimizer):
                optim.latest_grad_norm = norm
        if signum and self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name

    def _drop_step(self, skip_step_optim: Any) -> None:
        """A non-finite step: drop its gradients, its metrics and (``SkipStepAdamW``) its loss
        from the optimizer's rolling statistics, which a NaN would poison for 128 steps."""
        from olmo_core.distributed.utils import get_rank
        from olmo_core.train.common import ReduceType

        self.trainer.train_module.zero_grads()
        if skip_step_optim is not None and skip_step_optim._losses:
            skip_step_optim._losses.pop()  # appended by the train module's train_batch
        # OLMo-core raises on a non-finite CE loss when it logs the step's metrics and has no
        # public way to withdraw a recorded metric: drop this step's losses from its buffer.
        step_metrics = getattr(self.trainer, "_metrics", {}).get(self.step, {})
        for name in [n for n in step_metrics if n.startswith("train/")]:
            del step_metrics[name]
        self.trainer.record_metric("olmx/non-finite step", 1.0, reduce_type=ReduceType.max)
        self.nonfinite_steps.append(self.step)
        action = "skipped" if self.on_nonfinite == "skip" else "stopping"
        log.warning(f"non-finite loss or gradient at step {self.step}: optimizer step {action}")
        if get_rank() == 0:
            append_event(self.run_dir, "nonfinite", step=self.step, action=self.on_nonfinite)
        if self.on_nonfinite == "stop":
            self.stop_reason = self.stop_reason or "nonfinite"

    def post_step(self) -> None:
        """Cancel on every rank at the step they agreed on (the checkpointer then saves it)."""
        if self.stop_reason is not None and not self.trainer.is_canceled:
            self.trainer.cancel_run(self.stop_reason, no_sync=True)

    def state_dict(self) -> dict[str, Any]:
        """The non-finite steps so far (they survive resumes)."""
        return {"nonfinite_steps": list(self.nonfinite_steps)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.nonfinite_steps = list(state_dict.get("nonfinite_steps", []))


def configure_faults(run_dir: str | Path) -> None:
    """Where :func:`inject` keeps its once-only markers (``RUN_DIR/work/faults``)."""
    global _fault_dir
    _fault_dir = RunDir(run_dir).work / "faults"


def _faults() -> list[tuple[str, int, int | None]]:
    out = []
    for item in filter(None, (s.strip() for s in os.environ.get(FAULTS_ENV, "").split(","))):
        kind, _, where = item.partition("@")
        step, _, rank = where.partition(":")
        out.append((kind, int(step), int(rank) if rank else None))
    return out


def inject(kind: str, step: int) -> bool:
    """Fire the fault ``kind`` at ``step`` on this rank if ``OLMX_FAULTS`` asks for it and it
    has not fired yet (module doc); True if it fired (``nan``: the caller poisons the step)."""
    if FAULTS_ENV not in os.environ or _fault_dir is None:
        return False
    rank = int(os.environ.get("RANK", 0))
    for k, s, r in _faults():
        if k != kind or s != step or (r if r is not None else (rank if kind == "nan" else 0)) != rank:
            continue
        marker = _fault_dir / f"{kind}@{step}.rank{rank}"
        if marker.exists():
            return False
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        log.warning(f"injecting fault {kind} at step {step} on rank {rank}")
        if kind in ("kill", "killsave"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "spin":
            while True:
                pass
        elif kind == "hold":
            deadline = time.monotonic() + 120
            while not stop_requested() and time.monotonic() < deadline:
                time.sleep(0.05)
        return True
    return False


@dataclass
class FaultInjector(Callback):
    """Fires the faults of ``OLMX_FAULTS`` (tests only; added when that variable is set)."""

    priority: ClassVar[int] = 100
    _hook: Any = field(default=None, repr=False)

    def pre_step(self, batch: dict[str, Any]) -> None:
        """``nan``: poison this step's input embeddings."""
        if inject("nan", self.step):
            embeddings = self.trainer.train_module.model.embeddings
            self._hook = embeddings.register_forward_hook(lambda m, i, out: out * float("nan"))

    def pre_optim_step(self) -> None:
        """``kill``, ``term``, ``hold``, ``stop``, ``spin`` after the backward pass; remove a
        ``nan`` hook."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for kind in ("kill", "term", "hold", "stop", "spin"):
            inject(kind, self.step)


def fault_callbacks(run: Any, run_dir: str, stop_check_interval: int = 1) -> dict[str, Callback]:
    """The Trainer callbacks of this module for a run."""
    callbacks: dict[str, Callback] = {
        "olmx_guard": TrainingGuard(
            on_nonfinite=run.trainer.on_nonfinite,
            run_dir=run_dir,
            max_grad_norm=run.trainer.max_grad_norm,
            stop_check_interval=stop_check_interval,
            last_step=min(run.trainer.max_steps, run.trainer.stop_at_step or run.trainer.max_steps),
        )
    }
    if os.environ.get(FAULTS_ENV):
        configure_faults(run_dir)
        callbacks["olmx_faults"] = FaultInjector()
    return callbacks
