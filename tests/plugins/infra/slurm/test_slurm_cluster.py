"""The Slurm helpers against a real one-node Slurm cluster (scripts/slurm/up.sh).

Skipped unless ``OLMX_SLURM=1`` (.ci/run sets it after starting the cluster). The Python that
runs torchrun and the workers on the node is ``OLMX_SLURM_PYTHON``, by default the one running
the tests. Each test submits a rendered script with ``sbatch`` and follows it with squeue /
scontrol exactly as olmx does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from olmx.rundir import tail
from olmx_plugins.infra.slurm import jobs

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("OLMX_SLURM") != "1",
        reason="needs the local Slurm cluster: run scripts/slurm/up.sh as root, then set OLMX_SLURM=1",
    ),
]

PYTHON = os.environ.get("OLMX_SLURM_PYTHON", sys.executable)

# Each worker records its pid, then waits; on SIGTERM it records that and exits 0.
SLEEPER = r"""
import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank = os.environ["RANK"]
def on_term(*_):
    (out / f"term-{rank}").write_text("TERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(out / f"started-{rank}").write_text(str(os.getpid()))
time.sleep(300)
"""


def _submit(run_dir: Path, command: list[str], *, nproc_per_node: int, **kwargs) -> str:
    script = jobs.render_sbatch(
        run_dir=run_dir,
        command=command,
        nproc_per_node=nproc_per_node,
        python=PYTHON,
        cpus_per_task=nproc_per_node,
        env={"OUT_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"},
        **kwargs,
    )
    return jobs.submit(script, run_dir=run_dir)


def _wait_for_file(path: Path, job_id: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        state = jobs.job_state(job_id)
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), (state, tail(jobs.log_path(job_id, path.parent)))
        assert time.monotonic() < deadline, f"{path.name} not written after {timeout} s"
        time.sleep(0.2)


def _pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_torchrun_job_all_reduces_across_two_processes(tmp_path: Path) -> None:
    code = r"""
import json, os, pathlib, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ids = torch.zeros(world)
ids[rank] = rank + 1
dist.all_reduce(ids)
print(f"rank {rank}/{world}: all-reduced {ids.tolist()}")
if rank == 0:
    (pathlib.Path(os.environ["OUT_DIR"]) / "result.json").write_text(
        json.dumps({"world": world, "ids": ids.tolist(), "master": os.environ["MASTER_ADDR"]}))
dist.destroy_process_group()
"""
    start = time.monotonic()
    job_id = _submit(tmp_path, [PYTHON, "-c", code], nproc_per_node=2)
    states: list[str] = []
    state, exit_code = jobs.wait(job_id, on_state=states.append, poll=0.25, timeout=180)
    elapsed = time.monotonic() - start
    log = tail(jobs.log_path(job_id, tmp_path), 40)
    assert (state, exit_code) == ("COMPLETED", 0), log
    assert jobs.outcome(job_id) == ("COMPLETED", 0)
    assert states[-1] == "COMPLETED" and "RUNNING" in states
    # Every rank contributed its id + 1 exactly once.
    assert json.loads((tmp_path / "result.json").read_text()) == {"world": 2, "ids": [1.0, 2.0], "master": "localhost"}
    port = jobs.PORT_BASE + int(job_id) % jobs.PORT_SPAN
    assert f"rendezvous localhost:{port}" in log
    assert "rank 0/2: all-reduced [1.0, 2.0]" in log and "rank 1/2: all-reduced [1.0, 2.0]" in log
    assert "srun exited with status 0" in log
    print(f"sbatch -> COMPLETED round trip: {elapsed:.1f} s (states {states})")


def test_failing_job_gives_its_exit_code_and_log(tmp_path: Path) -> None:
    code = "import sys; print('olmx-test: worker fails now', flush=True); sys.exit(3)"
    job_id = _submit(tmp_path, [PYTHON, "-c", code], nproc_per_node=1)
    state, exit_code = jobs.wait(job_id, poll=0.25, timeout=180)
    log = tail(jobs.log_path(job_id, tmp_path), 60)
    assert state == "FAILED", log
    # torchrun reports the worker's status 3 and itself exits with 1; srun and the script pass it on.
    assert exit_code == 1, log
    assert "olmx-test: worker fails now" in log
    assert "exitcode  : 3" in log
    assert "srun exited with status 1" in log


def test_cancel_stops_a_running_job_with_sigterm(tmp_path: Path) -> None:
    job_id = _submit(tmp_path, [PYTHON, "-c", SLEEPER], nproc_per_node=1)
    _wait_for_file(tmp_path / "started-0", job_id)
    pid = int((tmp_path / "started-0").read_text())
    assert jobs.job_state(job_id) == "RUNNING"
    assert jobs.outcome(job_id) is None
    jobs.cancel(job_id)
    state, _ = jobs.wait(job_id, poll=0.25, timeout=60)
    assert state == "CANCELLED"
    assert (tmp_path / "term-0").read_text() == "TERM"  # the worker saw SIGTERM, not only SIGKILL
    deadline = time.monotonic() + 15
    while not _pid_gone(pid):
        assert time.monotonic() < deadline, f"worker {pid} still alive after cancel"
        time.sleep(0.2)
    jobs.cancel(job_id)  # cancelling an ended job is not an error


def test_sigterm_to_the_batch_script_reaches_the_workers(tmp_path: Path) -> None:
    """What ``--signal=B:TERM@N`` does before the time limit: only the batch shell gets
    SIGTERM (here sent at once with ``scancel --batch``); its trap must pass it on."""
    job_id = _submit(tmp_path, [PYTHON, "-c", SLEEPER], nproc_per_node=1, signal_seconds=60, time=10)
    _wait_for_file(tmp_path / "started-0", job_id)
    jobs.cancel(job_id, signal="TERM", batch_only=True)
    state, exit_code = jobs.wait(job_id, poll=0.25, timeout=60)
    log = tail(jobs.log_path(job_id, tmp_path), 60)
    assert (tmp_path / "term-0").read_text() == "TERM", log
    assert "batch script got SIGTERM; passing it on to the job steps" in log
    assert state in jobs.TERMINAL_STATES and state != "CANCELLED", (state, log)
    print(f"batch SIGTERM: final state {state}, exit code {exit_code}")
