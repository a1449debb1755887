"""Goodput (olmx/goodput.py) over hand-made clock ledgers: every second of two attempts of one
launch accounted for, the work lost to the failure, and the share ``olmx runs`` shows. (A real
run's ledgers are checked in tests/worker/test_hang.py, whose restart they account.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from olmx.goodput import CATEGORIES, account, bar
from olmx.rundir import RunDir


def ledger(run_dir: Path, name: str, **fields: object) -> None:
    folder = RunDir(run_dir).clock
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(fields))


def steps(data: float, compute: float, first: float, count: int, evaluation: float = 0.0, ckpt: float = 0.0) -> dict:
    return {
        "data": data,
        "compute": compute,
        "first": first,
        "count": count,
        "evaluation": evaluation,
        "checkpointing": ckpt,
    }


def test_two_attempts_of_a_launch_are_split_into_every_category(tmp_path):
    # attempt 0: launched at 100, process at 102, first step at 110; 6 steps of 1 s after a first of
    # 5 s (7 steps: 11 s, 2 of them waiting for data); checkpoint at step 4 after 8 s of steps; 3 s
    # of saves, 2 s of evaluation; last step at 135, last entry at 140 (waiting for a hung peer).
    ledger(
        tmp_path,
        "L-0",
        launch="L",
        attempt=0,
        resumed_from=None,
        launch_time=100.0,
        process_start=102.0,
        first_step_start=110.0,
        progress=135.0,  # its last step; it then waited for a lost peer until 140
        updated=140.0,
        last_step=7,
        steps=steps(2.0, 9.0, 5.0, 7, evaluation=2.0, ckpt=3.0),
        checkpoints={"4": 8.0},
    )
    # attempt 1 of the same launch: started at 170 (35 s of failure and restart), resumed from step 4, first
    # step at 175, 8 steps of 1 s (first 1 s: nothing compiles again), last entry at 190.
    ledger(
        tmp_path,
        "L-1",
        launch="L",
        attempt=1,
        resumed_from=4,
        launch_time=100.0,
        process_start=170.0,
        first_step_start=175.0,
        updated=190.0,
        last_step=12,
        steps=steps(0.0, 8.0, 1.0, 8, ckpt=1.0),
        checkpoints={"8": 4.0, "12": 8.0},
    )
    found = account(tmp_path)
    assert found is not None
    s = found["seconds"]
    assert found["wall_s"] == 35.0 + 35.0 + 20.0  # 100-135, the failure and restart, 170-190
    assert s["start-up"] == 10.0 + 5.0
    assert s["compile"] == 5.0 - 1.0  # the first step beyond the mean of the other six
    assert s["lost"] == 11.0 - 8.0  # steps 5-7 were done again after the resume from step 4
    assert s["productive"] == (11.0 - 4.0 - 3.0) + 8.0
    assert (s["evaluation"], s["checkpointing"], s["restarts"]) == (2.0, 4.0, 35.0)
    assert s["waiting"] == pytest.approx(90.0 - sum(v for k, v in s.items() if k != "waiting"))
    assert list(s) == list(CATEGORIES)
    assert found["goodput"] == round(12.0 / 90.0, 4)
    line = bar(found, width=20)
    assert line.startswith("|###" + "." * 17 + "| productive 13%, start-up 17%, compile 4%")
    assert line.endswith("of 0:01:30")


def test_a_resume_from_an_older_checkpoint_loses_all_of_the_attempt_and_runs_show_the_share(tmp_path):
    from olmx.runs import run_row

    common = {"launch_time": None, "checkpoints": {}}
    ledger(tmp_path, "A-0", launch="A", attempt=0, resumed_from=None, process_start=0.0, first_step_start=2.0,
           updated=12.0, last_step=3, steps=steps(0.0, 10.0, 4.0, 3), **common)  # fmt: skip
    ledger(tmp_path, "B-0", launch="B", attempt=0, resumed_from=None, process_start=50.0, first_step_start=52.0,
           updated=62.0, last_step=3, steps=steps(0.0, 10.0, 4.0, 3), **common)  # fmt: skip
    found = account(tmp_path)
    assert found is not None
    # the second launch started over (resumed from nothing): the first one's steps are lost, but
    # its compile time stays compile; the time between the launches is nobody's
    assert found["wall_s"] == 24.0
    assert found["seconds"]["lost"] == 10.0 - 1.0 and found["seconds"]["compile"] == 2.0
    assert found["seconds"]["productive"] == 9.0
    (tmp_path / "plan.yaml").write_text("config: {trainer: {max_steps: 3}}\n")
    assert run_row(tmp_path).goodput == round(9.0 / 24.0, 4)
    assert account(tmp_path / "nowhere") is None
