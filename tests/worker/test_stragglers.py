"""Stragglers (olmx/worker/stragglers.py) through the real CLI on 2 gloo processes: a rank that
computes more in every step is named by the metrics, ``olmx report`` and ``olmx runs``; the
uninterrupted reference run names none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from olmx import metrics as names
from olmx.goodput import straggler
from tests.conftest import olmx_cli
from tests.test_training import SMALL

pytestmark = pytest.mark.dist


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_rank_that_computes_more_is_named_and_a_balanced_run_names_none(tmp_path, reference_run):
    run = tmp_path / "run"
    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache"), "OLMX_FAULTS": "slow@2:1"}
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", "trainer.max_steps=8", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    slow = [r for r in records(run) if r["step"] >= 3]
    # rank 1 computes 0.3 s more in every step from step 2; rank 0 waits for it in the all-reduce
    assert all(r[names.SLOWEST_RANK] == 1 for r in slow), slow
    # the median of 2 ranks is their mean: half rank 1's extra 0.3 s, and at least half rank 0's wait
    assert all(r[names.COMPUTE_MAX] - r[names.COMPUTE_MEDIAN] > 0.1 for r in slow), slow
    assert all(r[names.STEP_TIME] >= r[names.COMPUTE_MAX] - 0.01 for r in slow), slow
    assert all(r[names.WAIT_MEDIAN] > 0.1 for r in slow), slow
    line = straggler(records(run))
    assert line is not None and line.startswith("rank 1 is slower than the median in ")
    listed = olmx_cli("runs", str(tmp_path), "--json")
    assert json.loads(listed.stdout)[0]["straggler"] == line
    assert straggler(records(reference_run)) is None  # the same ranks, left alone
