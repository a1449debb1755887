"""olmx's trainer callbacks: windowed tokens/s, and MFU against olmx's peak table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


class FakeTrainer:
    """What the callbacks read of OLMo-core's Trainer."""

    def __init__(self, device_type: str = "cpu") -> None:
        self.global_step = 0
        self.device = SimpleNamespace(type=device_type)
        self.dp_process_group = None
        self.train_module = None
        self.metrics: dict[str, float] = {}

    def record_metric(self, name, value, reduce_type=None):
        self.metrics[name] = value


def test_tokens_per_s_is_over_the_last_window_of_steps(monkeypatch):
    """A slow first step (start-up, compilation) and a slow step later (a recompile) leave the
    rate once they are out of the window; a cumulative rate would carry them for ever."""
    from olmx.worker import callbacks

    cb = callbacks.OlmxMetricsCallback(tokens_per_step=1000)
    cb.trainer = FakeTrainer()
    clock = iter([])
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    # step 1 ends at 60 s (start-up), then 1 s per step, step 10 takes 30 s (a recompile)
    ends, t = [], 60.0
    for step in range(1, 41):
        t += 0 if step == 1 else (30.0 if step == 10 else 1.0)
        ends.append(t)
    clock = iter(ends)
    cb.pre_train()
    rates = []
    for step in range(1, 41):
        cb.trainer.global_step = step
        cb.post_step()
        rates.append(cb._tokens_per_s())
    assert rates[0] is None  # one step ended: nothing to measure yet
    assert rates[1] == pytest.approx(1000.0)  # the first step's 60 s never count
    assert rates[10] == pytest.approx(10 * 1000 / (9 + 30))  # the recompile is in the window ...
    assert rates[-1] == pytest.approx(1000.0)  # ... and out of it 20 steps later
    assert callbacks.WINDOW_STEPS == 20


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", "bfloat16", 989e12),  # OLMo-core 3.0.0 takes an H200 for an A100 (312e12)
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
        ("NVIDIA A100-SXM4-80GB", "float32", 19.5e12),
        ("NVIDIA B200", "bfloat16", 2.25e15),
        ("Some Future GPU", "bfloat16", None),  # unknown: no MFU rather than a wrong one
    ],
)
def test_mfu_is_against_olmxs_peak_for_the_device(monkeypatch, name, dtype, peak):
    import torch

    from olmx.worker.callbacks import OlmxSpeedMonitorCallback

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cb = OlmxSpeedMonitorCallback(compute_dtype=dtype)
    cb.trainer = FakeTrainer("cuda")
    cb.pre_train()
    assert cb.device_peak_flops_per_second == (int(peak) if peak else None)


def test_a_step_is_marked_skipped_only_where_the_guard_said_so(tmp_path):
    """``olmx/non-finite step`` is 1.0 on a non-finite step; where the ranks' metrics differ (a
    pipeline's stages) OLMo-core's reduction reports it as -inf on every other step, which is
    not a skipped step."""
    import json

    from olmx.worker import callbacks

    cb = callbacks.OlmxMetricsCallback(run_dir=str(tmp_path), tokens_per_step=10)
    cb.trainer = FakeTrainer()
    cb.log_metrics(1, {"train/CE loss": 4.0, "olmx/non-finite step": float("-inf")})
    cb.log_metrics(2, {"olmx/non-finite step": 1.0})
    cb.log_metrics(3, {"train/CE loss": 3.0})
    cb.log_metrics(3, {"checkpoint/save_duration_s": 0.5})  # a checkpoint step's second flush
    cb.close()  # the last step's record is written once its flushes are in
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r.get("skipped", False)) for r in records] == [
        (1, 4.0, False),
        (2, None, True),
        (3, 3.0, False),
    ]
    assert records[0]["olmx/non-finite step"] is None  # -inf: JSON has none
    assert records[2]["checkpoint/save_duration_s"] == 0.5 and records[2]["tokens"] == 30  # one record a step
