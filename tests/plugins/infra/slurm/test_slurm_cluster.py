"""The Slurm helpers against a real one-node Slurm cluster (scripts/slurm/up.sh).

Skipped unless ``OLMX_SLURM=1`` (.ci/run sets it after starting the cluster). The Python that
runs torchrun and the workers on the node is ``OLMX_SLURM_PYTHON``, by default the one running
the tests. Each test submits a rendered script with ``sbatch`` and follows it with squeue /
scontrol exactly as olmx does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
        cpus_per_task=kwargs.pop("cpus_per_task", nproc_per_node),
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


def _node_cpus() -> int:
    proc = subprocess.run(["sinfo", "-h", "-n", "localhost", "-o", "%c"], capture_output=True, text=True, check=True)
    return int(proc.stdout.split()[0])


def _lift_begin_time(job_id: str, marker: str) -> bool:
    """Start a requeued job now instead of after Slurm's cred_expire (120 s, Reason=BeginTime),
    as an administrator would: once its last run's processes are gone and the node is done
    with it (slurmd refuses a relaunch within the second it revoked the last run's credential:
    "Job credential revoked"). True when it lifted it."""
    details = jobs.job_details(job_id)
    if not (details["JobState"] == "PENDING" and details.get("Reason") == "BeginTime"):
        return False
    if subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        return False
    node = subprocess.run(["sinfo", "-h", "-n", "localhost", "-o", "%T"], capture_output=True, text=True).stdout
    if "completing" in node:
        return False
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"], check=True)
    return True


# The worker of a run that saved a checkpoint and stopped on SIGTERM: its "end" event for this
# launch makes the batch script's outcome check say 75. argv[1] marks the job's processes.
STOPS_WITH_CHECKPOINT = r"""
import os, sys
from olmx.events import append_event
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
append_event(os.environ["OUT_DIR"], "end", reason="SIGTERM", step=10 * (restart + 1))
print(f"olmx-test: run {restart} stops with a checkpoint", flush=True)
sys.exit(75)
"""


def test_a_job_that_always_stops_with_a_checkpoint_hits_the_requeue_cap(tmp_path: Path) -> None:
    start = time.monotonic()
    job_id = _submit(
        tmp_path,
        [PYTHON, "-c", STOPS_WITH_CHECKPOINT, str(tmp_path)],
        nproc_per_node=1,
        requeue=True,
        max_requeues=2,
    )
    lifted = 0
    deadline = time.monotonic() + 150
    while (state := jobs.job_state(job_id)) not in jobs.TERMINAL_STATES:
        assert time.monotonic() < deadline, (state, tail(jobs.log_path(job_id, tmp_path), 40))
        lifted += _lift_begin_time(job_id, str(tmp_path))
        time.sleep(0.25)
    elapsed = time.monotonic() - start
    log = jobs.log_path(job_id, tmp_path).read_text()
    details = jobs.job_details(job_id)
    # Three runs, each exits 75: two requeues, then the cap; the job ends FAILED with 75.
    assert (state, jobs.job_exit_code(details), details["Restarts"]) == ("FAILED", 75, "2"), log
    assert lifted == 2
    assert [f"olmx-test: run {n} stops with a checkpoint" in log for n in range(4)] == [True, True, True, False]
    assert log.count("requeueing job") == 2
    assert f"requeueing job {job_id} to resume it (requeue 1 of at most 2)" in log
    assert f"requeueing job {job_id} to resume it (requeue 2 of at most 2)" in log
    assert (
        f"job {job_id} has been requeued 2 time(s) (infra.max_requeues=2): not requeueing it again; "
        "run the same olmx train to resume"
    ) in log
    ends = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["launch"], e["step"]) for e in ends] == [(f"slurm-{job_id}-{n}", 10 * (n + 1)) for n in range(3)]
    print(f"3 runs, 2 requeues, capped: {elapsed:.1f} s")


# Rank 0 writes what Slurm says about its job and step, and the CPUs it may run on.
REPORTS_RESOURCES = r"""
import json, os, pathlib, subprocess
def show(*what):
    return subprocess.run(["scontrol", "show", *what, "--oneliner"], capture_output=True, text=True).stdout
job, step = os.environ["SLURM_JOB_ID"], os.environ["SLURM_STEP_ID"]
(pathlib.Path(os.environ["OUT_DIR"]) / "resources.json").write_text(json.dumps({
    "job": show("job", job),
    "step": show("step", f"{job}.{step}"),
    "cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
    "affinity": len(os.sched_getaffinity(0)),
}))
"""


def _fields(text: str) -> dict[str, str]:
    return dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z:/_]*)=(\S*)", text))


@pytest.mark.parametrize("shared", [False, True], ids=["whole-node", "shared"])
def test_the_job_gets_the_cpus_and_memory_it_asked_for(tmp_path: Path, shared: bool) -> None:
    """``scontrol show job``/``step`` from inside the job: the default (``--exclusive``, every
    CPU of the node to the task, ``--mem=0``) and explicit ``--cpus-per-task``/``--mem``."""
    cpus = _node_cpus()
    kwargs: dict = dict(cpus_per_task=1, mem="512M") if shared else dict(exclusive=True, mem="0")
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command=[PYTHON, "-c", REPORTS_RESOURCES],
        nproc_per_node=1,
        python=PYTHON,
        env={"OUT_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"},
        **kwargs,
    )
    job_id = jobs.submit(script, run_dir=tmp_path)
    state, code = jobs.wait(job_id, poll=0.25, timeout=120)
    log = tail(jobs.log_path(job_id, tmp_path), 40)
    assert (state, code) == ("COMPLETED", 0), log
    seen = json.loads((tmp_path / "resources.json").read_text())
    job, step = _fields(seen["job"]), _fields(seen["step"])
    want = 1 if shared else cpus
    assert f", {want} CPUs per node's task" in log
    # srun was given the number (it does not inherit it from the batch job).
    assert seen["cpus_per_task"] == str(want)
    assert step["CPUs"] == str(want) and step["Tasks"] == "1"
    if shared:
        assert (job["NumCPUs"], job["CPUs/Task"], job["MinMemoryNode"], job["OverSubscribe"]) == (
            "1",
            "1",
            "512M",
            "OK",
        )
    else:
        assert (job["NumCPUs"], job["MinMemoryNode"], job["OverSubscribe"]) == (str(cpus), "0", "NO")
    print(
        f"{'shared' if shared else 'whole node'}: job {job['NumCPUs']} CPUs, step {step['CPUs']}, "
        f"affinity {seen['affinity']}"
    )


APPTAINER_STANDIN = r"""#!/bin/bash
# Stands in for `apptainer exec [--nv] [--bind=..] --pwd=DIR IMAGE CMD...`: records its argv and
# the APPTAINERENV_ variables, then runs CMD in DIR with them applied, as apptainer would.
printf '%s\0' "$@" >> "$OUT_DIR/apptainer.args"; printf '\n' >> "$OUT_DIR/apptainer.args"
[ "$1" = exec ] || exit 64
shift
while [ "${1#--}" != "$1" ]; do case "$1" in --pwd=*) cd "${1#--pwd=}" || exit 65 ;; esac; shift; done
[ -e "$1" ] || { echo "apptainer stand-in: no image $1" >&2; exit 66; }
shift
for v in ${!APPTAINERENV_@}; do export "${v#APPTAINERENV_}=${!v}"; echo "$v" >> "$OUT_DIR/apptainer.env"; done
exec "$@"
"""


def test_apptainer_command_chain_under_real_srun(tmp_path: Path) -> None:
    """srun -> ``apptainer exec ... IMAGE python -m torch.distributed.run`` -> workers, with an
    `apptainer` stand-in (Debian has no Apptainer package; it runs the command on the host) that
    checks what the script gives it: a real Apptainer image is not run here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(APPTAINER_STANDIN)
    (bin_dir / "apptainer").chmod(0o755)
    (tmp_path / "image.sif").write_text("not an image")
    code = (
        "import os, pathlib; r = os.environ['RANK']; "
        "pathlib.Path(os.environ['OUT_DIR'], f'rank-{r}').write_text(os.environ['NCCL_DEBUG'] + ' ' + os.getcwd())"
    )
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command=["python3", "-c", code],
        nproc_per_node=2,
        python=PYTHON,
        cpus_per_task=2,
        container_runtime="apptainer",
        container_image=str(tmp_path / "image.sif"),
        container_mounts=[f"{tmp_path}:{tmp_path}"],
        env={"OUT_DIR": str(tmp_path), "NCCL_DEBUG": "WARN", "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    job_id = jobs.submit(script, run_dir=tmp_path)
    state, exit_code = jobs.wait(job_id, poll=0.25, timeout=120)
    log = tail(jobs.log_path(job_id, tmp_path), 40)
    assert (state, exit_code) == ("COMPLETED", 0), log
    calls = [c.split("\0")[:-1] for c in (tmp_path / "apptainer.args").read_text().split("\n") if c]
    assert len(calls) == 1  # the training step only: it succeeded, so no outcome check
    assert calls[0][:5] == [
        "exec",
        f"--bind={tmp_path}:{tmp_path}",
        f"--pwd={tmp_path}",
        str(tmp_path / "image.sif"),
        PYTHON,
    ]
    assert calls[0][5:8] == ["-m", "torch.distributed.run", "--nnodes=1"]
    assert sorted((tmp_path / "apptainer.env").read_text().split()) == [
        "APPTAINERENV_NCCL_DEBUG",
        "APPTAINERENV_OLMX_LAUNCH_ID",
        "APPTAINERENV_OUT_DIR",
        "APPTAINERENV_PATH",
    ]
    for rank in (0, 1):
        assert (tmp_path / f"rank-{rank}").read_text() == f"WARN {tmp_path}"
