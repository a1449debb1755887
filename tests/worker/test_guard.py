"""The step guard in one process: one gradient norm per step decides a non-finite step, clips
(equal to torch's own clipping) and feeds OLMo-core's SkipStepAdamW; a dropped step leaves
the parameters and optimizer state untouched and its NaN out of SkipStepAdamW's
rolling statistics; stop signals are agreed
on the metrics cadence. The multi-process behaviour (ranks agreeing, checkpoints) is in
tests/worker/test_faults.py through the real CLI."""

from __future__ import annotations

import copy
import signal
from types import SimpleNamespace

import pytest
import torch
from olmo_core.optim import SkipStepAdamW
from olmo_core.train.common import TRAIN_CE_LOSS_METRIC

from olmx import stop
from olmx.worker.faults import TrainingGuard


class FakeTrainer:
    """The parts of OLMo-core's Trainer the guard touches: step, metrics, the train module."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.global_step = 0
        self._metrics: dict[int, dict[str, torch.Tensor]] = {}
        self.train_module = SimpleNamespace(
            model=model, optim=optim, zero_grads=lambda: optim.zero_grad(set_to_none=True)
        )

    def record_metric(self, name, value, reduce_type=None, namespace=None):
        key = f"{namespace}/{name}" if namespace else name
        self._metrics.setdefault(self.global_step, {})[key] = torch.as_tensor(value)

    def get_metric(self, name):
        return self._metrics.get(self.global_step, {}).get(name)


def make(run_dir, max_grad_norm=None, interval=1, last_step=1000):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optim = SkipStepAdamW(model.parameters(), lr=1e-2, rolling_interval_length=8, sigma_factor=6)
    trainer = FakeTrainer(model, optim)
    guard = TrainingGuard(
        on_nonfinite="skip",
        run_dir=str(run_dir),
        max_grad_norm=max_grad_norm,
        stop_check_interval=interval,
        last_step=last_step,
    )
    guard.trainer = trainer
    return model, optim, trainer, guard


def step(model, optim, trainer, guard, *, poison=False, scale=1.0):
    """One training step as OLMo-core's Trainer orders it (train_batch, callbacks, optim_step)."""
    trainer.global_step += 1
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(trainer.global_step))
    loss = (model(x) * scale).pow(2).mean() * (float("nan") if poison else 1.0)
    loss.backward()
    trainer.record_metric(TRAIN_CE_LOSS_METRIC, loss.detach())
    optim.latest_loss = loss.detach()  # as the train module does for a SkipStepOptimizer
    guard.pre_optim_step()
    optim.step()
    optim.zero_grad(set_to_none=True)


def test_clipping_equals_torchs_and_the_norm_feeds_skip_step_adamw(tmp_path):
    model, optim, trainer, guard = make(tmp_path, max_grad_norm=0.05)
    ref = copy.deepcopy(model)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    (ref(x) * 10).pow(2).mean().backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    assert ref_norm > 0.05  # so clipping really scales

    trainer.global_step = 1
    loss = (model(x) * 10).pow(2).mean()
    loss.backward()
    trainer.record_metric(TRAIN_CE_LOSS_METRIC, loss.detach())
    optim.latest_loss = loss.detach()
    guard.pre_optim_step()
    torch.testing.assert_close(optim.latest_grad_norm, ref_norm)
    torch.testing.assert_close(trainer._metrics[1]["optim/total grad norm"], ref_norm)
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, r.grad)


def test_a_dropped_step_leaves_state_untouched_and_no_nan_in_the_statistics(tmp_path):
    model, optim, trainer, guard = make(tmp_path)
    for _ in range(10):  # past half the rolling window: SkipStepAdamW now judges every step
        step(model, optim, trainer, guard)
    before = copy.deepcopy(model.state_dict()), copy.deepcopy(optim.state_dict())
    losses, norms = list(optim._losses), list(optim._grad_norms)

    step(model, optim, trainer, guard, poison=True)
    assert guard.nonfinite_steps == [11]
    assert TRAIN_CE_LOSS_METRIC not in trainer._metrics[11]
    assert '"event": "nonfinite"' in (tmp_path / "events.jsonl").read_text()
    for name, value in before[0].items():
        assert torch.equal(model.state_dict()[name], value), name
    assert optim.state_dict()["state"].keys() == before[1]["state"].keys()
    for k, state in optim.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, before[1]["state"][k][name]), (k, name)
    # The NaN loss the train module appended is withdrawn (appending it had already pushed the
    # oldest loss out of the full window); the norm was never appended.
    assert len(losses) == 8 + 1
    assert [float(v) for v in optim._losses] == [float(v) for v in losses[1:]]
    assert [float(v) for v in optim._grad_norms] == [float(v) for v in norms]

    # Without the drop a NaN would sit in the statistics and every later step would be skipped.
    step(model, optim, trainer, guard)
    assert float(optim.step_skipped) == 0.0
    assert all(torch.isfinite(v) for v in optim._losses)


def test_an_outlier_step_is_skipped_on_the_device_by_skip_step_adamw(tmp_path):
    model, optim, trainer, guard = make(tmp_path)
    for _ in range(10):
        step(model, optim, trainer, guard)
    before = copy.deepcopy(model.state_dict())
    step(model, optim, trainer, guard, scale=1e4)  # finite, but far above the rolling mean
    assert guard.nonfinite_steps == []
    assert float(optim.step_skipped) == 1.0
    for name, value in before.items():
        assert torch.equal(model.state_dict()[name], value), name


@pytest.mark.parametrize("interval", [1, 4])
def test_stop_signals_are_agreed_on_the_metrics_cadence_and_at_the_last_step(interval, monkeypatch, tmp_path):
    monkeypatch.setattr(stop, "_requested", 0)  # restored after the test
    model, optim, trainer, guard = make(tmp_path, interval=interval, last_step=6)
    step(model, optim, trainer, guard)
    stop.request_stop(signal.SIGTERM)
    step(model, optim, trainer, guard)  # step 2
    assert guard.stop_reason == ("SIGTERM" if interval == 1 else None)
    step(model, optim, trainer, guard)
    step(model, optim, trainer, guard)  # step 4
    assert guard.stop_reason == "SIGTERM"
    late = make(tmp_path, interval=4, last_step=2)
    step(*late)
    step(*late)  # the last step is checked whatever the cadence
    assert late[3].stop_reason == "SIGTERM"
