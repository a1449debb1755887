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

Before either, the step is diagnosed (:mod:`olmx.worker.diagnosis`): every rank's own loss, a
replay of every rank's micro-batches with forward hooks on every module (on itself and on
another rank; the parameters are still the step's), the token file and offset of each of its
sequences, gathered in one collective; the ``nonfinite`` event names the ranks whose own loss
went non-finite, the first module whose output did, the documents and a verdict (``data``,
``numerics``, ``this rank``).

**Spikes** (``trainer.spike_zscore``, default 6): a finite loss more than that many standard
deviations above the mean of the last :data:`SPIKE_WINDOW` good steps (judged from
:data:`SPIKE_MIN_STEPS` on) is diagnosed the same way, a spiking loss counting as the failure,
and recorded as a ``spike`` event; the step goes on (``SkipStepAdamW`` skips outliers by its own
statistics). The loss is read in the step's one host copy of the flags, and the window is kept
on the host and in checkpoints. A good step does no more work for the diagnosis than keeping
the step's batch and its micro-batches' losses by reference.

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

- ``nan``: the input embeddings of that step's forward passes (the guard's replay on that rank
  included) are multiplied by NaN (the loss and every gradient become NaN, the parameters are
  untouched): a rank broken for one step;
- ``poison``: from that step on (every rank by default), the input embeddings of the
  vocabulary's last token id are infinite: a token file holding that id is data that fails
  wherever it is read;
- ``kill``: SIGKILL of the rank after its backward pass, before the optimizer step;
- ``term``: SIGTERM to the rank at the same point (a preemption notice reaching one rank);
- ``hold``: the rank waits there until a stop signal arrives (at most 120 s), so a test can
  send a real signal at a known step;
- ``killsave``: SIGKILL of the rank while saving that step's checkpoint, after its files are
  written and before it is verified and published (with ``trainer.async_save``: in the save's
  background thread, while the main thread trains the next steps);
- ``nospace``: the rank's first write of that step's checkpoint (its trainer state) raises
  ``OSError(ENOSPC)``, as on a full disk;
- ``stop``: SIGSTOP of the rank after its backward pass (a wedged process: the hang watchdog's
  case, :mod:`olmx.worker.watchdog`);
- ``spin``: the rank loops in Python there for good (a rank that spins instead of stepping);
- ``slow``: from that step on, the rank computes :data:`SLOW_S` seconds more in every step
  (a straggler: :mod:`olmx.worker.stragglers`).
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

from olmx.events import append_event, diagnosis_line
from olmx.rundir import RunDir
from olmx.stop import install_stop_handlers, request_stop, stop_requested

log = logging.getLogger(__name__)

#: Good steps whose losses the spike test compares with (``trainer.spike_zscore``), and how
#: many it needs before it judges (as OLMo-core's ``SkipStepAdamW``: a window of 128, judged
#: from half of it).
SPIKE_WINDOW = 128
SPIKE_MIN_STEPS = 64

#: CPU seconds a ``slow`` rank adds to every step.
SLOW_S = 0.3
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
    #: A loss this many standard deviations above the mean of the recent steps' is a spike,
    #: diagnosed like a non-finite step (``trainer.spike_zscore``; None: not looked for).
    spike_zscore: float | None = None
    #: The last :data:`SPIKE_WINDOW` good steps' losses (kept in checkpoints).
    recent_losses: list[float] = field(default_factory=list)
    _batch: Any = field(default=None, repr=False)
    _step_losses: list[Any] = field(default_factory=list, repr=False)

    def pre_train(self) -> None:
        """Take SIGTERM/SIGINT back from the handlers ``Trainer.fit`` just installed; keep each
        micro-batch's loss of a step by reference (read only on a bad step: the rank's own loss)."""
        install_stop_handlers()
        if getattr(self.trainer, "_cancel_reason", None):  # a signal landed in OLMo-core's handler
            request_stop(signal.SIGTERM)
        module = self.trainer.train_module
        parts = getattr(module, "model_parts", None) or [module.model]  # (a pipeline's .model raises)
        if len(parts) == 1 and hasattr(parts[0], "register_forward_hook"):
            parts[0].register_forward_hook(self._keep_loss)

    def _keep_loss(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if torch.is_grad_enabled() and getattr(output, "ce_loss", None) is not None:  # training only
            self._step_losses.append(output.ce_loss.detach())

    def pre_step(self, batch: dict[str, Any]) -> None:
        """The step's batch, for a diagnosis (a shallow copy: the train module pops its
        ``input_ids`` where the batch is one micro-batch)."""
        self._batch = dict(batch)
        self._step_losses.clear()

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
        # With trainer.spike_zscore the loss is read in the same host copy as the flags.
        value = get_local_tensor(loss).detach().to(norm.device).double().reshape(()) if self.watches(loss) else None
        if dist.is_available() and dist.is_initialized() and (check_stop or not loss_is_global):
            flags = torch.stack([torch.tensor(stop, device=norm.device), bad.long()])
            if value is not None:  # the largest rank's loss where each rank has its own
                flags = torch.cat([flags.double(), value[None]])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            signum, bad_flag, *seen = flags.tolist()  # the step's one host sync (one copy of all)
            signum, nonfinite = int(signum), bool(bad_flag)
        elif value is not None:
            bad_flag, *seen = torch.stack([bad.double(), value]).tolist()  # the step's one host sync
            signum, nonfinite = stop, bool(bad_flag)
        else:
            signum, nonfinite, seen = stop, bool(bad), []  # the step's one host sync
        if nonfinite:
            self._drop_step(optim if loss_is_global else None, self._diagnose())
        else:
            if seen:
                self._check_spike(seen[0])
            if self.max_grad_norm is not None:
                clip_grads_with_norm_(params, self.max_grad_norm, norm)
            # As OLMo-core's own clipping: already the global value, so no reduction.
            self.trainer.record_metric("total grad norm", norm, reduce_type=None, namespace="optim")
            if isinstance(optim, SkipStepOptimizer):
                optim.latest_grad_norm = norm
        if signum and self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name

    def watches(self, loss: Any) -> bool:
        """Whether this step's loss is read for the spike test (``trainer.spike_zscore`` set)."""
        return self.spike_zscore is not None and loss is not None

    def spike_threshold(self) -> float | None:
        """The loss above which a step is a spike: the recent mean plus ``spike_zscore``
        standard deviations (None before :data:`SPIKE_MIN_STEPS` good steps)."""
        if self.spike_zscore is None or len(self.recent_losses) < SPIKE_MIN_STEPS:
            return None
        mean, std = _mean_std(self.recent_losses)
        return mean + self.spike_zscore * std

    def _check_spike(self, value: float) -> None:
        """A good step's loss: a spike is diagnosed and recorded (a ``spike`` event; the step
        goes on as the optimizer decides: ``SkipStepAdamW`` skips outliers by its own
        statistics); then the loss joins the window. Every rank has the same value."""
        from olmo_core.distributed.utils import get_rank

        threshold = self.spike_threshold()
        if threshold is not None and value > threshold:
            mean, std = _mean_std(self.recent_losses)
            zscore = round((value - mean) / std, 2)
            fields = {"loss": value, "mean": round(mean, 6), "std": round(std, 6), "zscore": zscore}
            fields |= self._diagnose(threshold)
            line = diagnosis_line(fields)
            log.warning(f"loss spike at step {self.step}: {value:.4f}, {zscore} sd above the recent mean; {line}")
            if get_rank() == 0:
                append_event(self.run_dir, "spike", step=self.step, **fields)
        self.recent_losses = [*self.recent_losses, value][-SPIKE_WINDOW:]

    def _diagnose(self, threshold: float | None = None) -> dict[str, Any]:
        """Every rank's findings, gathered (one collective), and the verdict
        (:mod:`olmx.worker.diagnosis`); {} where it could not run."""
        import math

        import torch.distributed as dist
        from olmo_core.distributed.utils import get_local_tensor

        from olmx.worker.diagnosis import diagnose, event_fields

        def bad(loss: float | None) -> bool:
            return loss is None or (threshold is not None and loss > threshold)

        local: float | None = None
        if self._step_losses:
            local = float(sum(get_local_tensor(v).float() for v in self._step_losses))
            local = local if math.isfinite(local) else None
        try:
            mine = diagnose(
                self.trainer.train_module,
                self.trainer.data_loader,
                self._batch,
                bad=bad,
                local_loss=local,
                local_known=bool(self._step_losses),
            )
        except Exception as e:  # noqa: BLE001 - a diagnosis never ends the run
            known = bool(self._step_losses)
            mine = {"rank": int(os.environ.get("RANK", 0)), "dp_rank": 0, "loss": local, "bad": known and bad(local)}
            mine["error"] = f"{type(e).__name__}: {e}"
        gathered: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        return event_fields(gathered)

    def _drop_step(self, skip_step_optim: Any, diagnosis: dict[str, Any] | None = None) -> None:
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
        line = diagnosis_line(diagnosis or {})
        log.warning(f"non-finite loss or gradient at step {self.step}: optimizer step {action}{line and '; ' + line}")
        if get_rank() == 0:
            append_event(self.run_dir, "nonfinite", step=self.step, action=self.on_nonfinite, **(diagnosis or {}))
        if self.on_nonfinite == "stop":
            self.stop_reason = self.stop_reason or "nonfinite"

    def post_step(self) -> None:
        """Cancel on every rank at the step they agreed on (the checkpointer then saves it)."""
        if self.stop_reason is not None and not self.trainer.is_canceled:
            self.trainer.cancel_run(self.stop_reason, no_sync=True)

    def state_dict(self) -> dict[str, Any]:
        """The non-finite steps so far and the spike window's losses (they survive resumes)."""
        return {"nonfinite_steps": list(self.nonfinite_steps), "recent_losses": list(self.recent_losses)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.nonfinite_steps = list(state_dict.get("nonfinite_steps", []))
        self.recent_losses = list(state_dict.get("recent_losses", []))


def _mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and sample standard deviation (at least 1e-6) of at least two values."""
    mean = sum(values) / len(values)
    return mean, max((sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5, 1e-6)


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


def inject(kind: str, step: int, where: str = "") -> bool:
    """Fire the fault ``kind`` at ``step`` on this rank if ``OLMX_FAULTS`` asks for it and it
    has not fired yet (module doc); True if it fired (``nan``, ``poison``: the caller poisons;
    ``nospace`` raises, naming ``where``)."""
    if FAULTS_ENV not in os.environ or _fault_dir is None:
        return False
    rank = int(os.environ.get("RANK", 0))
    for k, s, r in _faults():
        if k != kind or s != step or (r if r is not None else (rank if kind in ("nan", "poison") else 0)) != rank:
            continue
        marker = _fault_dir / f"{kind}@{step}.rank{rank}"
        if marker.exists():
            return False
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        log.warning(f"injecting fault {kind} at step {step} on rank {rank}")
        if kind in ("kill", "killsave"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "nospace":
            import errno

            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)
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
    #: The token id ``poison`` poisons (the vocabulary's last).
    poison_token: int = -1
    _hook: Any = field(default=None, repr=False)
    _slow: bool = False

    def pre_step(self, batch: dict[str, Any]) -> None:
        """``nan``: poison this step's input embeddings; ``poison``: from now on, those of
        :attr:`poison_token`."""
        embeddings = self.trainer.train_module.model.embeddings
        if inject("nan", self.step):
            self._hook = embeddings.register_forward_hook(lambda m, i, out: out * float("nan"))
        if inject("poison", self.step):
            token = self.poison_token

            def poison(module: Any, args: Any, out: Any) -> Any:
                return out.masked_fill((args[0] == token).unsqueeze(-1), float("inf"))

            embeddings.register_forward_hook(poison)

    def pre_optim_step(self) -> None:
        """``kill``, ``term``, ``hold``, ``stop``, ``spin`` after the backward pass; ``slow``
        there from its step on."""
        for kind in ("kill", "term", "hold", "stop", "spin"):
            inject(kind, self.step)
        self._slow = inject("slow", self.step) or self._slow
        if self._slow:
            end = time.process_time() + SLOW_S
            while time.process_time() < end:
                pass

    def post_train_batch(self) -> None:
        """Remove a ``nan`` hook (after the step guard, whose replay on this rank it still
        poisons: the rank is broken for the whole step)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def fault_callbacks(run: Any, run_dir: str, stop_check_interval: int = 1) -> dict[str, Callback]:
    """The Trainer callbacks of this module for a run."""
    callbacks: dict[str, Callback] = {
        "olmx_guard": TrainingGuard(
            on_nonfinite=run.trainer.on_nonfinite,
            run_dir=run_dir,
            max_grad_norm=run.trainer.max_grad_norm,
            stop_check_interval=stop_check_interval,
            last_step=min(run.trainer.max_steps, run.trainer.stop_at_step or run.trainer.max_steps),
            spike_zscore=run.trainer.spike_zscore,
        )
    }
    if os.environ.get(FAULTS_ENV):
        configure_faults(run_dir)
        callbacks["olmx_faults"] = FaultInjector(poison_token=run.data.tokenizer.vocab_size - 1)
    return callbacks
