"""Checkpoint saves through the real CLI (2 gloo processes): asynchronous saves give the
synchronous run's losses and checkpoints, a rank killed in the middle of an asynchronous save
loses nothing, and a disk that fills during a save stops the run with one line and resumes.
Compared, bitwise, with the session's ``reference_run`` (synchronous saves at 4, 8, 12)."""

from __future__ import annotations

import pytest

from olmx.events import EXIT_PREEMPTED
from tests.test_training import REFERENCE_STEPS
from tests.worker.test_faults import (
    assert_same_state,
    cache,  # noqa: F401 - the module's token cache fixture
    checkpoint_state,
    events,
    explain,
    losses,
    records,
    train,
)

pytestmark = pytest.mark.dist

ASYNC = "trainer.async_save=true"


def published(run, step: int) -> bool:
    return (run / "checkpoints" / f"step{step}" / ".metadata.json").is_file()


def test_async_saves_match_sync_and_a_kill_mid_save_loses_nothing(tmp_path, cache, reference_run):  # noqa: F811
    ref = reference_run
    run = tmp_path / "async"
    proc = train(run, cache, *REFERENCE_STEPS, ASYNC)
    assert proc.returncode == 0, explain(proc, run)
    assert losses(records(run)) == losses(records(ref))
    for step in (4, 8, 12):  # every background save holds the state of its own step
        assert published(run, step) and (run / "checkpoints" / f"step{step}" / "olmx-manifest.json").is_file()
        assert_same_state(
            checkpoint_state(run / "checkpoints" / f"step{step}"), checkpoint_state(ref / "checkpoints" / f"step{step}")
        )

    # Rank 0 is SIGKILLed in the background thread of step 8's save (its files written, not yet
    # verified or published) while its main thread trains on: step 8 never counts.
    killed = tmp_path / "killed"
    proc = train(killed, cache, *REFERENCE_STEPS, ASYNC, faults="killsave@8:0")
    assert proc.returncode != 0
    assert published(killed, 4) and not published(killed, 8)
    proc = train(killed, cache, *REFERENCE_STEPS, ASYNC)
    assert proc.returncode == 0, explain(proc, killed)
    assert events(killed, "start")[-1]["resumed_from"] == 4
    assert "step8" in [p["path"].rsplit("/", 1)[-1] for p in events(killed, "checkpoint_partial")]
    assert losses(records(killed)) == losses(records(ref))
    assert_same_state(
        checkpoint_state(killed / "checkpoints" / "step12"), checkpoint_state(ref / "checkpoints" / "step12")
    )


def test_a_full_disk_during_a_save_stops_with_one_line_and_resumes(tmp_path, cache, reference_run):  # noqa: F811
    run = tmp_path / "run"
    # Rank 1 alone gets ENOSPC writing step 8's checkpoint; rank 0's write succeeded.
    proc = train(run, cache, *REFERENCE_STEPS, faults="nospace@8:1")
    assert proc.returncode == EXIT_PREEMPTED, explain(proc, run)
    line = (
        f"checkpoint step 8 could not be written: No space left on device ({run / 'checkpoints'}); "
        f"the checkpoint of step 4 is intact; free some space first: run the same olmx train again"
    )
    assert line in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert events(run, "end")[-1] == {**events(run, "end")[-1], "reason": "nospace", "step": 4, "failed_step": 8}
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step4"] and published(run, 4)  # the partial save removed

    proc = train(run, cache, *REFERENCE_STEPS)
    assert proc.returncode == 0, explain(proc, run)
    assert events(run, "start")[-1]["resumed_from"] == 4
    assert losses(records(run)) == losses(records(reference_run))


def test_a_full_disk_on_rank_0_before_the_save_folder_exists_stops_every_rank_at_once(tmp_path, cache):  # noqa: F811
    """Rank 0 creates the save's ``train`` folder, which OLMo-core has the other ranks wait for up
    to 120 s: ENOSPC there reached them only as a ``TimeoutError`` of their own two minutes
    later (a ``rank_failed`` record blaming rank 1). Now every rank raises it at once."""
    run = tmp_path / "run"
    proc = train(run, cache, "trainer.max_steps=4", "trainer.save_interval=4", faults="nospace@4:0")
    assert proc.returncode == EXIT_PREEMPTED, explain(proc, run)
    said = " ".join(proc.stderr.split())
    assert "checkpoint step 4 could not be written: No space left on device" in said, proc.stderr
    assert "there is no earlier checkpoint" in said and "TimeoutError" not in proc.stderr
    assert not events(run, "rank_failed") and "restarted after" not in proc.stderr
    [end] = events(run, "end")
    assert (end["reason"], end["failed_step"], end["step"]) == ("nospace", 4, None)
    assert end["time"] - events(run, "start")[0]["time"] < 60  # not OLMo-core's 120 s wait
    assert not list((run / "checkpoints").iterdir())
