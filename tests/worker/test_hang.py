"""The hang watchdog (olmx/worker/watchdog.py) through the real CLI on 2 gloo processes: a rank
stopped by SIGSTOP and a rank spinning in Python are named, every process ends, the lock is
freed, and the run resumes (by hand, or by torchrun's restart) to the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from olmx.events import EXIT_HANG, read_events
from olmx.rundir import process_state
from olmx.worker.watchdog import classify, verdict
from tests.conftest import olmx_cli
from tests.test_training import REFERENCE_STEPS, SMALL

pytestmark = pytest.mark.dist

#: Seconds without progress: far above a step of SMALL (~0.2 s) or its checkpoint save.
TIMEOUT = ["trainer.hang_timeout=10"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def train(run_dir: Path, env: dict, *overrides: str, faults: str = ""):
    return olmx_cli(
        "train", *SMALL, f"trainer.run_dir={run_dir}", *REFERENCE_STEPS, *overrides, env={**env, "OLMX_FAULTS": faults}
    )


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def explain(proc, run_dir: Path) -> str:
    log = run_dir / "logs" / "node0.log"
    return proc.stdout[-2000:] + proc.stderr[-3000:] + (log.read_text()[-5000:] if log.exists() else "")


def test_a_stopped_rank_is_named_ended_and_the_run_resumes(tmp_path, cache, reference_run):
    run = tmp_path / "run"
    proc = train(run, cache, *TIMEOUT, faults="stop@6:1")
    assert proc.returncode == EXIT_HANG, explain(proc, run)
    line = (
        "hang at step 6: no progress for 10 s (trainer.hang_timeout); "
        "rank 1 stopped responding (process stopped by a signal; last heartbeat "
    )
    assert line in proc.stderr, explain(proc, run)
    assert "rank 0 waits in all_reduce" in proc.stderr and "no restarts left (infra.max_restarts=0)" in proc.stderr
    assert "Traceback" not in proc.stderr
    (hang,) = [e for e in read_events(run) if e["event"] == "hang"]
    assert (hang["step"], hang["ranks"], hang["collective"], hang["attempt"]) == (6, [1], "all_reduce", 0)
    folder = Path(hang["folder"])
    assert folder == run / "hang" / "attempt0"
    # rank 0 reported (its stack, in JSON and as faulthandler prints every thread); rank 1 could not
    assert (folder / "rank0.report.json").is_file() and not (folder / "rank1.report.json").exists()
    assert "all_reduce" in (folder / "rank0.stack.txt").read_text()
    stopped = json.loads((folder / "rank1.beat.json").read_text())
    assert stopped["step"] <= 6 and process_state(stopped["pid"]) is None  # killed, not left stopped
    # nothing is left holding the run: the same command resumes from step 4 to the reference losses
    proc = train(run, cache, *TIMEOUT)
    assert proc.returncode == 0, explain(proc, run)
    assert "Resuming from the checkpoint at step 4" in proc.stdout
    assert losses(run) == losses(reference_run)


def test_a_spinning_rank_is_named_and_torchrun_restarts_from_the_checkpoint(tmp_path, cache, reference_run):
    run = tmp_path / "run"
    proc = train(run, cache, *TIMEOUT, "infra.max_restarts=1", faults="spin@6:1")
    assert proc.returncode == 0, explain(proc, run)
    (hang,) = [e for e in read_events(run) if e["event"] == "hang"]
    assert hang["ranks"] == [1] and hang["step"] == 6
    assert "rank 1 spins in Python at " in hang["summary"] and "faults.py" in hang["summary"]
    assert "restarted after a hang at step 6" in proc.stderr
    assert "restarted after node 0" not in proc.stderr  # the hang is said once, with its verdict
    starts = [(e["attempt"], e["resumed_from"]) for e in read_events(run) if e["event"] == "start"]
    assert starts == [(0, None), (1, 4)]
    assert losses(run) == losses(reference_run)
    # goodput accounts the failure: step 5 done twice, the hang's wait and the restart between the
    # attempts, and every second of the launch in one category
    good = json.loads((run / "summary.json").read_text())["goodput"]
    seconds = good["seconds"]
    assert seconds["lost"] > 0 and seconds["restarts"] >= 10 and seconds["productive"] > 0
    assert sum(seconds.values()) == pytest.approx(good["wall_s"], abs=0.01)
    assert good["goodput"] == pytest.approx(seconds["productive"] / good["wall_s"], abs=1e-4)


def test_the_verdict_reads_reports_beats_and_process_states():
    """Unit: who stopped, who spins, where the others wait (no processes needed)."""
    import socket

    host = socket.gethostname()
    in_torch = [{"file": f"{os.sep}x{os.sep}torch{os.sep}distributed{os.sep}c10d.py", "line": 1, "function": "barrier"}]
    spin = [{"file": "/job/loop.py", "line": 7, "function": "busy"}]
    assert classify(in_torch) == ("waits", "barrier") and classify(spin) == ("spins", "/job/loop.py:7 in busy")
    reports = {0: {"where": "waits", "at": "barrier", "step": 9}, 2: {"where": "spins", "at": "/job/loop.py:7 in busy"}}
    beats = {r: {"host": host, "pid": os.getpid(), "step": 9, "time": time.time() - 5} for r in range(3)}
    found = verdict(reports, beats, 3)
    assert found["ranks"] == [1, 2] and found["collective"] == "barrier" and found["step"] == 9
    assert found["summary"] == (
        "rank 1 stopped responding (process running; last heartbeat 5 s ago, at step 9); "
        "rank 2 spins in Python at /job/loop.py:7 in busy; "
        "rank 0 waits in barrier"
    )
    everyone_waits = verdict({r: {"where": "waits", "at": "barrier"} for r in range(2)}, {}, 2)
    assert everyone_waits["ranks"] == [0, 1] and everyone_waits["summary"].startswith("no rank is outside torch")
