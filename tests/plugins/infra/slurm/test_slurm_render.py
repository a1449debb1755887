"""The sbatch template and the Slurm helpers, without a Slurm cluster.

The rendered script is checked as text, by ``bash -n``, and by running it under bash with
stand-ins for ``scontrol`` and ``srun`` on PATH (they record their arguments), which tests its
shell logic: the rendezvous host and port, the words handed to srun, the exit status, and that
it refuses to guess a host. The real cluster is exercised in test_slurm_cluster.py.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from olmx.rundir import tail
from olmx_plugins.infra.slurm import jobs
from olmx_plugins.infra.slurm.jobs import SlurmError

BASH = shutil.which("bash") or "/bin/bash"


def _sbatch_options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def _srun_line(script: str) -> str:
    """The training step's srun command with its continuation lines joined."""
    lines = script.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("srun ") and "--kill-on-bad-exit" in line]
    assert len(starts) == 1, f"expected exactly one training srun command, found {len(starts)}"
    out = []
    for line in lines[starts[0] :]:
        out.append(line.rstrip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(out)


def test_minimal_script_runs_one_torchrun_per_node_with_c10d(tmp_path: Path) -> None:
    script = jobs.render_sbatch(run_dir=tmp_path, command="olmx run /runs/a/plan.yaml", nproc_per_node=2)
    options = _sbatch_options(script)
    assert options == [
        "--job-name=olmx",
        "--nodes=1",
        "--ntasks-per-node=1",
        f"--output={tmp_path}/slurm-%j.out",
        f"--error={tmp_path}/slurm-%j.out",
    ]
    srun = _srun_line(script)
    assert srun.startswith(
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 python -m torch.distributed.run'
    )
    for arg in (
        '--nnodes="$SLURM_JOB_NUM_NODES"',
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$RDZV_HOST:$RDZV_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
    ):
        assert arg in srun.split()
    # The worker command follows --no-python verbatim and is sent to the background.
    assert srun.endswith("--no-python olmx run /runs/a/plan.yaml &")
    assert 'RDZV_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    assert f"RDZV_PORT=$(( {jobs.PORT_BASE} + SLURM_JOB_ID % {jobs.PORT_SPAN} ))" in script
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "localhost" in line or "127.0.0.1" in line]
    assert "--container" not in script
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    assert exports == ['export OLMX_LAUNCH_ID="slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"']
    # A failed srun ends with the run's own outcome code (75 preempted, 76 non-finite) ...
    assert "python -m olmx.events " + str(tmp_path) + ' "$OLMX_LAUNCH_ID"' in script
    assert "scontrol requeue" not in script  # ... and is requeued only when allowed
    assert f"cd {tmp_path} ||" in script


def test_every_option_lands_where_it_belongs(tmp_path: Path) -> None:
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command=["olmx", "run", f"{tmp_path}/plan.yaml"],
        nproc_per_node=8,
        nodes=4,
        python="/opt/venv/bin/python",
        job_name="tiny",
        partition="gpu",
        account="ai2",
        time="02:00:00",
        gpus_per_node=8,
        cpus_per_task=64,
        mem="512G",
        signal_seconds=120,
        requeue=True,
        container_image="nvcr.io#nvidia/pytorch:25.01-py3",
        container_mounts="/data:/data",
        env={"NCCL_DEBUG": "WARN", "ODD": "a b'$c"},
        workdir="/src/olmx",
        extra_sbatch_args=["--exclusive", "--qos=high"],
        torchrun_flags=["--max-restarts=2", "--log-dir=/runs/a b/logs/torchrun", "--tee=3"],
    )
    assert _sbatch_options(script) == [
        "--job-name=tiny",
        "--nodes=4",
        "--ntasks-per-node=1",
        f"--output={tmp_path}/slurm-%j.out",
        f"--error={tmp_path}/slurm-%j.out",
        "--partition=gpu",
        "--account=ai2",
        "--time=02:00:00",
        "--gpus-per-node=8",
        "--cpus-per-task=64",
        "--mem=512G",
        "--signal=B:TERM@120",
        "--requeue",
        "--open-mode=append",
        "--exclusive",
        "--qos=high",
    ]
    srun = _srun_line(script)
    assert "--cpus-per-task=64" in srun.split()
    assert "--container-image='nvcr.io#nvidia/pytorch:25.01-py3'" in srun
    assert "--container-mounts=/data:/data --container-workdir=/src/olmx" in srun
    assert "/opt/venv/bin/python -m torch.distributed.run" in srun
    assert "--nproc-per-node=8" in srun.split()
    assert "export NCCL_DEBUG=WARN" in script.splitlines()
    assert "export ODD=" + shlex.quote("a b'$c") in script.splitlines()
    assert "cd /src/olmx ||" in script
    assert "trap forward_term TERM" in script
    assert "--max-restarts=2 '--log-dir=/runs/a b/logs/torchrun' --tee=3" in srun
    # A run that stopped with a checkpoint (exit 75) requeues the job, which resumes from it.
    assert 'if [ "$rc" -eq 75 ]; then' in script and 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in script
    # The run's outcome is read inside the job's container (the host need not have its Python).
    assert (
        "srun --nodes=1 --ntasks=1 --container-image='nvcr.io#nvidia/pytorch:25.01-py3' "
        "--container-mounts=/data:/data --container-workdir=/src/olmx /opt/venv/bin/python -m olmx.events "
        f'{tmp_path} "$OLMX_LAUNCH_ID"'
    ) in script


@pytest.mark.parametrize("full", [False, True])
def test_rendered_script_is_valid_bash(tmp_path: Path, full: bool) -> None:
    extra = dict(partition="p", time=30, signal_seconds=60, requeue=True, env={"A": "1"}, container_image="img")
    script = jobs.render_sbatch(
        run_dir=tmp_path, command="olmx run plan.yaml", nproc_per_node=1, **(extra if full else {})
    )
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- the script, run with stand-ins


def _fake_slurm(tmp_path: Path, *, hostnames: str | None, srun_rc: int = 0) -> Path:
    """A PATH folder with `head`, a `scontrol` that prints ``hostnames`` (left out when None)
    and an `srun` that writes its argv, NUL-separated, to srun.args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "head").symlink_to(shutil.which("head"))
    if hostnames is not None:
        (bin_dir / "scontrol").write_text(f"#!{BASH}\nprintf '%s' {shlex.quote(hostnames)}\n")
    (bin_dir / "srun").write_text(f"#!{BASH}\nprintf '%s\\0' \"$@\" > {tmp_path}/srun.args\nexit {srun_rc}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def _run_script(script: str, tmp_path: Path, bin_dir: Path, job_id: int = 12345) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sh"
    path.write_text(script)
    env = {
        "PATH": str(bin_dir),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    return subprocess.run([BASH, str(path)], capture_output=True, text=True, env=env, timeout=30)


def test_script_hands_srun_the_rendezvous_and_the_exact_worker_argv(tmp_path: Path) -> None:
    worker = ["/opt/py/bin/python", "-c", "print('a b', \"$HOME\")", "--flag=x y"]
    script = jobs.render_sbatch(run_dir=tmp_path, command=worker, nproc_per_node=3, python="/opt/py/bin/python")
    proc = _run_script(script, tmp_path, _fake_slurm(tmp_path, hostnames="node-a\nnode-b\n", srun_rc=7))
    assert proc.returncode == 7, proc.stderr
    port = jobs.PORT_BASE + 12345 % jobs.PORT_SPAN
    assert f"rendezvous node-a:{port}" in proc.stdout
    assert "srun exited with status 7" in proc.stdout
    argv = (tmp_path / "srun.args").read_text().split("\0")[:-1]
    assert argv == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "/opt/py/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=node-a:{port}",
        "--rdzv-id=12345",
        "--no-python",
        *worker,
    ]


@pytest.mark.parametrize("hostnames", ["", None], ids=["no-host", "no-scontrol"])
def test_script_refuses_to_guess_the_rendezvous_host(tmp_path: Path, hostnames: str | None) -> None:
    script = jobs.render_sbatch(run_dir=tmp_path, command="true", nproc_per_node=1)
    proc = _run_script(script, tmp_path, _fake_slurm(tmp_path, hostnames=hostnames))
    assert proc.returncode == 1
    assert ("named no host" if hostnames == "" else "scontrol is not on PATH") in proc.stderr
    assert not (tmp_path / "srun.args").exists()


# ---------------------------------------------------------------- validation and helpers


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (dict(partition="gpu debug"), "partition"),
        (dict(time="1:00 "), "time"),
        (dict(nodes=0), "nodes"),
        (dict(nproc_per_node=0), "nproc_per_node"),
        (dict(cpus_per_task=0), "cpus_per_task"),
        (dict(env={"1BAD": "x"}), "env"),
        (dict(extra_sbatch_args=["-p gpu"]), "extra_sbatch_args"),
        (dict(command="olmx run\nrm -rf /"), "command"),
        (dict(run_dir="/runs/with space"), "run_dir"),
    ],
)
def test_bad_values_name_their_argument(tmp_path: Path, kwargs: dict, names: str) -> None:
    args = dict(run_dir=tmp_path, command="olmx run plan.yaml", nproc_per_node=1) | kwargs
    with pytest.raises(SlurmError, match=rf"^slurm {names}"):
        jobs.render_sbatch(**args)


def test_missing_slurm_commands_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match=r"`sbatch` was not found on PATH"):
        jobs.submit("#!/bin/bash\ntrue\n", run_dir=tmp_path / "run")
    assert (tmp_path / "run" / "sbatch.sh").read_text() == "#!/bin/bash\ntrue\n"
    with pytest.raises(SlurmError, match=r"`squeue` was not found"):
        jobs.job_state("1")


def test_failing_slurm_command_reports_its_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "squeue").write_text(
        f"#!{BASH}\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError) as err:
        jobs.job_state("42")
    assert str(err.value) == (
        "`squeue --noheader --jobs 42 --format %T` failed with exit status 1: "
        "slurm_load_jobs error: Unable to contact slurm controller"
    )


def test_log_path_and_tail(tmp_path: Path) -> None:
    log = jobs.log_path("77", tmp_path)
    assert log == tmp_path / "slurm-77.out"
    assert tail(log, 5) == ""
    lines = [f"line {i} " + "x" * (i % 50) for i in range(20000)]
    log.write_text("\n".join(lines) + "\n")
    assert tail(log, 3) == "\n".join(lines[-3:])
    assert tail(log, 1) == lines[-1]
    assert tail(log, 0) == ""
    log.write_text("only\n")
    assert tail(log, 10) == "only"


def test_exit_code_reads_status_and_signal() -> None:
    assert jobs.job_exit_code({"ExitCode": "0:0"}) == 0
    assert jobs.job_exit_code({"ExitCode": "3:0"}) == 3
    assert jobs.job_exit_code({"ExitCode": "0:15"}) == 143
    assert jobs.job_exit_code({}) is None


def test_rendezvous_ports_stay_below_the_ephemeral_range() -> None:
    assert 1024 < jobs.PORT_BASE and jobs.PORT_BASE + jobs.PORT_SPAN - 1 < 32768
