"""The verdict of a non-finite or spiking step (olmx.worker.diagnosis) from every rank's
findings, the event's fields, an instance's token file and offset, a replay's first
non-finite module, and the guard's spike test. The runs through the real CLI (a broken rank,
every rank, a poisoned token file) are in tests/worker/test_faults.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from olmx.events import diagnosis_line
from olmx.worker.datasets import instance_source
from olmx.worker.diagnosis import DATA, NUMERICS, THIS_RANK, Finding, event_fields, nonfinite_rows, verdict
from tests.worker.test_guard import make, step


def test_one_rank_broken_is_this_rank_whether_or_not_it_fails_again_on_itself():
    for home in (True, False, None):
        decided, ranks, reason = verdict(
            [Finding(0, False, False, away=True, away_on=1), Finding(1, True, home, away=False, away_on=0)]
        )
        assert (decided, ranks) == (THIS_RANK, [1]), home
        assert "only rank 1 failed" in reason and "rank 1's on rank 0" in reason
        assert ("fail again on rank 1 itself" in reason) == bool(home)


def test_data_that_fails_again_on_another_rank_is_data():
    decided, ranks, reason = verdict(
        [Finding(0, False, False, away=False, away_on=3), Finding(1, True, True, away=True, away_on=2)]
        + [Finding(r, False, False, away=False, away_on=(r + 1) % 4) for r in (2, 3)]
    )
    assert (decided, ranks) == (DATA, [1]) and reason == "rank 1's micro-batches fail again when replayed on rank 2"
    # One rank: replayed on itself is the only replay there is.
    assert verdict([Finding(0, True, True)])[0] == DATA
    assert verdict([Finding(0, True, False)])[:2] == (NUMERICS, [0])


def test_every_rank_failing_or_only_the_gradients_is_numerics():
    every = [Finding(r, True, True, away=True, away_on=(r + 1) % 2) for r in (0, 1)]
    assert verdict(every) == (NUMERICS, [0, 1], "every rank failed, each on its own data")
    decided, ranks, reason = verdict([Finding(r, False, False, away=False, away_on=1 - r) for r in (0, 1)])
    assert (decided, ranks) == (NUMERICS, []) and "backward" in reason
    # Several (not all) ranks whose data is fine elsewhere: not one rank's fault, not the data's.
    some = [Finding(0, True, False, away=False, away_on=2), Finding(1, True, False, away=False, away_on=0)]
    assert verdict([*some, Finding(2, False, False, away=False, away_on=1)])[:2] == (NUMERICS, [0, 1])
    # Not replayed elsewhere (no away finding): its replay on itself decides.
    assert verdict([Finding(0, True, True), Finding(1, False, False)])[0] == DATA


def test_event_fields_name_the_module_and_the_failing_documents():
    def rank(r, bad, module, sequences, other):
        docs = [[f"/d/{r}.npy", 64 * i] for i in range(2)]
        home = {"module": module, "sequences": sequences, "loss": None if bad else 5.0, "bad": bad}
        away = {"dp_rank": other, "module": None, "sequences": [], "loss": 5.1, "bad": False}
        mine = {"rank": r, "dp_rank": r, "loss": None if bad else 5.0, "bad": bad, "documents": docs, "replay": home}
        return mine, away

    (g0, a0), (g1, a1) = rank(0, False, None, [], 1), rank(1, True, "embeddings", [1], 0)
    g0["replayed_other"], g1["replayed_other"] = a0, {**a1, "bad": True, "module": "embeddings"}
    fields = event_fields([g1, g0])  # gathered in any order
    assert fields["verdict"] == THIS_RANK and fields["ranks"] == [1] and fields["module"] == "embeddings"
    assert fields["failing_documents"] == [["/d/1.npy", 64]]
    assert [b["rank"] for b in fields["by_rank"]] == [0, 1] and "bad" not in fields["by_rank"][0]
    json.dumps(fields)  # an event's fields
    line = diagnosis_line(fields)
    assert line.startswith("verdict: this rank (only rank 1 failed")
    assert line.endswith("first non-finite output: embeddings")
    assert diagnosis_line({"step": 3}) == ""


def test_instance_source_names_the_file_and_token_offset():
    ds = SimpleNamespace(paths=["a", "b", "c"], offsets=((0, 3), (3, 3), (3, 10)), sequence_length=64)
    assert instance_source(ds, 0) == ("a", 0)
    assert instance_source(ds, 2) == ("a", 128)
    assert instance_source(ds, 3) == ("c", 0)  # the empty array in between is skipped
    assert instance_source(ds, 9) == ("c", 384)


def test_nonfinite_rows_of_a_module_output():
    x = torch.zeros(3, 4, 2)
    assert nonfinite_rows(x) is None and nonfinite_rows((x, "text")) is None
    x[1, 2, 0] = float("inf")
    assert nonfinite_rows(x) == [1]
    assert nonfinite_rows({"logits": x}) == [1]
    assert nonfinite_rows(torch.tensor(float("nan"))) == []
    assert nonfinite_rows(torch.tensor([1, 2])) is None  # integers are never non-finite


def test_a_loss_spike_is_diagnosed_and_recorded_and_training_goes_on(tmp_path):
    from olmx.worker.faults import SPIKE_MIN_STEPS

    model, optim, trainer, guard = make(tmp_path)
    guard.spike_zscore = 6.0
    trainer.data_loader = None
    for _ in range(SPIKE_MIN_STEPS + 2):
        step(model, optim, trainer, guard)
    assert not (tmp_path / "events.jsonl").exists()
    assert len(guard.recent_losses) == SPIKE_MIN_STEPS + 2
    step(model, optim, trainer, guard, scale=1e3)
    [spike] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert spike["event"] == "spike" and spike["step"] == SPIKE_MIN_STEPS + 3 and spike["zscore"] > 6
    assert spike["verdict"] in (DATA, NUMERICS, THIS_RANK) and spike["by_rank"][0]["rank"] == 0
    assert guard.nonfinite_steps == [] and guard.stop_reason is None
    assert guard.state_dict()["recent_losses"][-1] == pytest.approx(spike["loss"])
    guard.spike_zscore = None  # off: the loss is not read, nothing is recorded
    step(model, optim, trainer, guard, scale=1e4)
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 1
