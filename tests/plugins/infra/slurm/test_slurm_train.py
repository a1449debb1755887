"""``olmx train infra=slurm`` end to end on the one-node Slurm cluster of scripts/slurm/up.sh.

Skipped unless ``OLMX_SLURM=1`` (.ci/run sets it after starting the cluster). Every test runs
the real ``olmx`` command, which submits with sbatch; the job runs torchrun with 2 CPU
workers on the node (the same machine, so the run directory is shared).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from olmx.rundir import tail
from olmx_plugins.infra.slurm import jobs
from tests.conftest import OLMX, olmx_cli
from tests.test_training import SMALL

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("OLMX_SLURM") != "1",
        reason="needs the local Slurm cluster: run scripts/slurm/up.sh as root, then set OLMX_SLURM=1",
    ),
]

# The default resources: the node alone (--exclusive), all of its CPUs to the task, --mem=0.
SLURM = ["infra=slurm", "infra.poll_seconds=0.5", "infra.time=10"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def job_id(run_dir: Path) -> str:
    return json.loads((run_dir / "launch.json").read_text())["job_id"]


def wait_for(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.25)
    return value


def test_train_on_slurm_end_to_end(tmp_path: Path, env: dict) -> None:
    run = tmp_path / "run"
    args = [*SLURM, *SMALL, f"trainer.run_dir={run}", "trainer.max_steps=4", "trainer.save_interval=2"]
    dry = olmx_cli("train", "--dry-run", *args, env=env)
    assert dry.returncode == 0, dry.stderr
    assert not run.exists()  # --dry-run writes nothing

    start = time.monotonic()
    proc = olmx_cli("train", *args, env=env)
    elapsed = time.monotonic() - start
    jid = job_id(run) if (run / "launch.json").exists() else "?"
    log = tail(jobs.log_path(jid, run), 40)
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    assert f"Submitted Slurm job {jid}" in proc.stdout
    assert jobs.job_state(jid) == "COMPLETED"
    # What --dry-run printed is exactly the script that was submitted.
    assert dry.stdout.split("# launch\n", 1)[1].rstrip("\n") == (run / "sbatch.sh").read_text().rstrip("\n")

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    for step in (2, 4):
        assert (run / "checkpoints" / f"step{step}" / ".metadata.json").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(p["rank"] for p in summary["processes"]) == [0, 1]
    full_log = jobs.log_path(jid, run).read_text()
    assert f"olmx: job {jid} on 1 node(s) [localhost], rendezvous localhost:" in full_log
    node_cpus = subprocess.run(["sinfo", "-h", "-n", "localhost", "-o", "%c"], capture_output=True, text=True).stdout
    assert f", {int(node_cpus)} CPUs per node's task (restart 0)" in full_log
    details = jobs.job_details(jid)
    assert (details["NumCPUs"], details["MinMemoryNode"], details["OverSubscribe"]) == (node_cpus.strip(), "0", "NO")
    assert "srun exited with status 0" in log

    status = olmx_cli("jobs", "status", str(run), env=env)
    assert status.returncode == 0 and f"Slurm job {jid}: COMPLETED" in status.stdout
    assert f"step 4/4, loss {losses[-1]:.4f}" in status.stdout
    print(f"olmx train infra=slurm, 4 steps: {elapsed:.1f} s")


def test_a_killed_rank_is_named_and_restarted_as_on_one_machine(tmp_path: Path, env: dict) -> None:
    """Rank 1 SIGKILLed inside step 3 of a one-node job: torchrun restarts from step 2, and the
    rank's failure is in events.jsonl and said, as a local launch says it (it was only in the
    job's log)."""
    from olmx.events import read_events

    run = tmp_path / "run"
    args = [*SLURM, *SMALL, f"trainer.run_dir={run}", "trainer.max_steps=4", "trainer.save_interval=2"]
    proc = olmx_cli("train", *args, "infra.max_restarts=1", env={**env, "OLMX_FAULTS": "kill@3:1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (failed,) = [e for e in read_events(run) if e["event"] == "rank_failed"]
    assert (failed["local_rank"], failed["exitcode"]) == (1, -9) and "SIGKILL" in failed["cause"]
    assert "restarted after node 0 local rank 1 (attempt 0): killed by SIGKILL" in proc.stderr
    starts = [(e["attempt"], e["resumed_from"]) for e in read_events(run) if e["event"] == "start"]
    assert starts == [(0, None), (1, 2)]


def test_detach_then_jobs_status_logs_cancel(tmp_path: Path, env: dict) -> None:
    run = tmp_path / "run"
    start = time.monotonic()
    proc = olmx_cli(
        "train", *SLURM, *SMALL, "infra.detach=true", f"trainer.run_dir={run}", "trainer.max_steps=5000", env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jid = job_id(run)
    assert f"Submitted Slurm job {jid}" in proc.stdout and f"olmx jobs status {run}" in proc.stdout
    assert jobs.job_state(jid) in ("PENDING", "CONFIGURING", "RUNNING")
    print(f"detached submit returned in {time.monotonic() - start:.1f} s")

    wait_for(lambda: jobs.job_state(jid) == "RUNNING", "RUNNING")
    status = olmx_cli("jobs", "status", str(run), env=env)
    assert f"Slurm job {jid}: RUNNING" in status.stdout, status.stdout + status.stderr
    wait_for(lambda: "rendezvous" in tail(jobs.log_path(jid, run), 50), "the first log line")
    logs = olmx_cli("jobs", "logs", str(run), "-n", "50", env=env)
    assert f"olmx: job {jid} on 1 node(s)" in logs.stdout

    cancel = olmx_cli("jobs", "cancel", str(run), env=env)
    assert cancel.returncode == 0, cancel.stderr
    wait_for(lambda: jobs.job_state(jid) == "CANCELLED", "CANCELLED", timeout=60)
    assert f"Slurm job {jid}: CANCELLED" in olmx_cli("jobs", "status", str(run), env=env).stdout
    again = olmx_cli("jobs", "cancel", str(run), env=env)
    assert again.returncode == 1 and "already ended (CANCELLED)" in again.stderr


def test_ctrl_c_without_a_terminal_leaves_the_job_running(tmp_path: Path, env: dict) -> None:
    run = tmp_path / "run"
    full_env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "COLUMNS": "200", **env}
    proc = subprocess.Popen(
        [*OLMX, "train", *SLURM, *SMALL, f"trainer.run_dir={run}", "trainer.max_steps=5000"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        jid = wait_for(lambda: (run / "launch.json").exists() and job_id(run), "the submission")
        wait_for(lambda: jobs.job_state(jid) == "RUNNING", "RUNNING")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, out + err
        assert f"Slurm job {jid} keeps running" in err and f"olmx jobs cancel {run}" in err
        assert jobs.job_state(jid) == "RUNNING"  # nobody said to cancel it
    finally:
        if proc.poll() is None:
            proc.kill()
        if (run / "launch.json").exists():
            jobs.cancel(job_id(run))


def test_failing_job_ends_the_command_with_its_exit_code_and_log(tmp_path: Path, env: dict) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'olmx-test: this node has no usable python' >&2\nexit 3\n")
    broken.chmod(0o755)
    run = tmp_path / "run"
    proc = olmx_cli("train", *SLURM, *SMALL, f"infra.python={broken}", f"trainer.run_dir={run}", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    jid = job_id(run)
    assert f"Slurm job {jid} ended FAILED with exit code 3" in proc.stderr
    assert "olmx-test: this node has no usable python" in proc.stderr  # the log tail
    assert "srun exited with status 3" in proc.stderr
    assert jobs.job_state(jid) == "FAILED"


def test_sigterm_before_the_time_limit_saves_requeues_and_resumes(tmp_path: Path, env: dict) -> None:
    """What ``--signal=B:TERM@N`` does near the time limit: SIGTERM to the batch script, which
    passes it to the job step; the workers save step 3 and exit 75; the script reads that
    outcome from events.jsonl and requeues the job (``infra.requeue=true``), whose second run
    resumes from step 3 and finishes. Rank 0 holds in step 3 until the signal comes
    (``OLMX_FAULTS=hold@3``, once per run directory, so the requeued run passes it).
    ``olmx train`` follows the job all the way: through the requeue to COMPLETED, exit 0."""
    run = tmp_path / "run"
    full_env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "COLUMNS": "200", **env}
    proc = subprocess.Popen(
        [
            *OLMX,
            "train",
            *SLURM,
            *SMALL,
            "infra.requeue=true",
            f"trainer.run_dir={run}",
            "trainer.max_steps=6",
            "trainer.save_interval=100",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**full_env, "OLMX_FAULTS": "hold@3"},
    )
    jid = "?"
    try:
        jid = wait_for(lambda: (run / "launch.json").exists() and job_id(run), "the submission")
        wait_for(
            lambda: (run / "metrics.jsonl").exists() and '"step": 2' in (run / "metrics.jsonl").read_text(), "step 2"
        )
        subprocess.run(["scancel", "--batch", "--signal=TERM", jid], check=True)
        wait_for(lambda: jobs.job_details(jid).get("Restarts") == "1", "the requeue", timeout=90)

        def lifted() -> bool:
            # Slurm keeps a requeued job ineligible for 120 s (Reason=BeginTime) so that the node
            # can finish the job's first run; lift that as an administrator would, once that run's
            # processes are gone and a few seconds more (slurmd refuses a relaunch that comes
            # while it still ends the first run: "Job credential revoked").
            details = jobs.job_details(jid)
            if details["JobState"] == "PENDING" and details.get("Reason") == "BeginTime":
                if subprocess.run(["pgrep", "-f", str(run / "plan.yaml")], capture_output=True).returncode != 0:
                    time.sleep(5)
                    subprocess.run(["scontrol", "update", f"jobid={jid}", "starttime=now"], check=True)
                    return True
            return details["JobState"] != "PENDING"

        wait_for(lifted, "the second run", timeout=180)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        if jid != "?" and jobs.job_state(jid) not in jobs.TERMINAL_STATES:
            jobs.cancel(jid)
    assert proc.returncode == 0, out + err
    assert jobs.job_state(jid) == "COMPLETED"
    # The follower said so when the job went back to the queue, and did not stop there.
    assert f"Slurm job {jid} was requeued (restart 1); it resumes from its last checkpoint" in err
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [
        (e["event"], e.get("launch"), e.get("reason"), e.get("step"), e.get("resumed_from"))
        for e in events
        if e["event"] in ("start", "end")
    ] == [
        ("start", f"slurm-{jid}-0", None, None, None),
        ("end", f"slurm-{jid}-0", "SIGTERM", 3, None),
        ("start", f"slurm-{jid}-1", None, None, 3),
        ("end", f"slurm-{jid}-1", "max_steps", 6, None),
    ]
    log = jobs.log_path(jid, run).read_text()
    assert f"requeueing job {jid} to resume it (requeue 1 of at most 3)" in log
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
