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
    # srun is always told the CPUs of its task: it does not read them from the batch job.
    assert srun.startswith(
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_TASK" '
        "--kill-on-bad-exit=1 python -m torch.distributed.run"
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
    # A failed srun ends with the run's own outcome code (75 preempted, 76 non-finite, 77 hang) ...
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
        gpu_type="h100",
        gpu_request="gres",
        cpus_per_task=64,
        exclusive=True,
        mem="512G",
        signal_seconds=120,
        requeue=True,
        max_requeues=5,
        container_image="nvcr.io#nvidia/pytorch:25.01-py3",
        container_mounts=["/data:/data", "/scratch:/scratch:ro"],
        container_env=["HF_TOKEN"],
        env={"NCCL_DEBUG": "WARN", "ODD": "a b'$c"},
        workdir="/src/olmx",
        extra_sbatch_args=["--qos=high"],
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
        "--gres=gpu:h100:8",
        "--exclusive",
        "--cpus-per-task=64",
        "--mem=512G",
        "--signal=B:TERM@120",
        "--requeue",
        "--open-mode=append",
        "--qos=high",
    ]
    srun = _srun_line(script)
    pyxis = (
        "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3' --container-name=olmx "
        "--container-mounts=/data:/data,/scratch:/scratch:ro --container-workdir=/src/olmx "
        "--container-env=HF_TOKEN,NCCL_DEBUG,ODD,OLMX_LAUNCH_ID"
    )
    assert srun.startswith(
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_TASK" '
        f"--gres=gpu:h100:8 --kill-on-bad-exit=1 {pyxis} /opt/venv/bin/python -m torch.distributed.run "
    ), srun
    assert "CPUS_PER_TASK=64" in script.splitlines()
    assert "SLURM_JOB_CPUS_PER_NODE" not in script  # the number is given, not read from the allocation
    assert "--nproc-per-node=8" in srun.split()
    assert "export NCCL_DEBUG=WARN" in script.splitlines()
    assert "export ODD=" + shlex.quote("a b'$c") in script.splitlines()
    assert "cd /src/olmx ||" in script
    assert "trap forward_term TERM" in script
    assert "--max-restarts=2 '--log-dir=/runs/a b/logs/torchrun' --tee=3" in srun
    # A run that stopped with a checkpoint (exit 75) requeues the job, at most 5 times.
    assert 'if [ "$rc" -eq 75 ]; then' in script and 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in script
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -ge 5 ]; then' in script
    # The run's outcome is read inside the job's container (the host need not have its Python),
    # the same named container, so pyxis does not import the image again.
    assert (
        f'    srun --nodes=1 --ntasks=1 {pyxis} /opt/venv/bin/python -m olmx.events {tmp_path} "$OLMX_LAUNCH_ID"'
    ) in script.splitlines()
    assert "APPTAINERENV" not in script


def test_apptainer_runs_inside_srun_with_binds_and_gpus(tmp_path: Path) -> None:
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command="python -m olmx run plan.yaml",
        nproc_per_node=4,
        gpus_per_node=4,
        container_runtime="apptainer",
        container_image="/images/torch.sif",
        container_mounts=["/data:/data", "/scratch:/scratch:ro"],
        container_env=["HF_TOKEN"],
        env={"NCCL_DEBUG": "WARN"},
    )
    srun = _srun_line(script)
    assert srun.startswith(
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_TASK" '
        "--gpus-per-node=4 --kill-on-bad-exit=1 apptainer exec --nv --bind=/data:/data,/scratch:/scratch:ro "
        f"--pwd={tmp_path} /images/torch.sif python -m torch.distributed.run "
    ), srun
    assert "--container" not in script
    # The outcome check runs on the batch host in the image, without srun or GPUs.
    assert (
        f"    apptainer exec --bind=/data:/data,/scratch:/scratch:ro --pwd={tmp_path} /images/torch.sif "
        f'python -m olmx.events {tmp_path} "$OLMX_LAUNCH_ID"'
    ) in script.splitlines()
    assert "for _name in HF_TOKEN NCCL_DEBUG OLMX_LAUNCH_ID ; do" in script.splitlines()
    singularity = jobs.render_sbatch(
        run_dir=tmp_path, command="true", nproc_per_node=1, container_runtime="singularity", container_image="a.sif"
    )
    assert "singularity exec --pwd=" in _srun_line(singularity) and "--nv" not in singularity
    assert 'export "SINGULARITYENV_$_name=${!_name}"' in singularity


def test_gpu_request_styles() -> None:
    assert jobs.gpu_option(8) == "--gpus-per-node=8"
    assert jobs.gpu_option(8, gpu_type="h100") == "--gpus-per-node=h100:8"
    assert jobs.gpu_option(2, request="gres") == "--gres=gpu:2"
    assert jobs.gpu_option(2, gpu_type="a100_80g", request="gres") == "--gres=gpu:a100_80g:2"


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [
        ("90", 5400),
        (10, 600),
        ("30:15", 1815),
        ("02:00:00", 7200),
        ("1-12", 129600),
        ("1-00:30", 88200),
        ("2-00:00:10", 172810),
        ("0", None),
        ("UNLIMITED", None),
        ("infinite", None),
        (None, None),
    ],
)
def test_time_limit_in_slurm_syntax(limit: str | int | None, seconds: int | None) -> None:
    assert jobs.time_limit_seconds(limit) == seconds


@pytest.mark.parametrize("limit", ["2h", "1:2:3:4", "-1", "1-", "1:00 ", ""])
def test_time_limit_refuses_what_slurm_would(limit: str) -> None:
    with pytest.raises(SlurmError, match=r"^slurm time=.*not a Slurm time limit"):
        jobs.time_limit_seconds(limit)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_rendered_script_is_valid_bash(tmp_path: Path, full: bool, runtime: str) -> None:
    extra = dict(
        partition="p",
        time=30,
        signal_seconds=60,
        requeue=True,
        max_requeues=2,
        exclusive=True,
        mem="0",
        gpus_per_node=2,
        env={"A": "1"},
        container_image="img",
    )
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command="olmx run plan.yaml",
        nproc_per_node=1,
        container_runtime=runtime,
        **(extra if full else {}),
    )
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- the script, run with stand-ins


def _fake_slurm(tmp_path: Path, *, hostnames: str | None, srun_rc: int = 0, events_rc: int = 1) -> Path:
    """A PATH folder of stand-ins: `head`; a `scontrol` that prints ``hostnames`` (left out
    when None) and appends the arguments of `scontrol requeue ...` to scontrol.calls; an `srun`
    that writes the argv of its first call, NUL-separated, to srun.args, counts its calls in
    srun.count and exits ``srun_rc``; a `fakepy` whose `-m olmx.events` exits ``events_rc``;
    an `apptainer` that writes its argv to apptainer.args and its APPTAINERENV_* variables to
    apptainer.env (first call only) and exits ``srun_rc``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "head").symlink_to(shutil.which("head"))
    if hostnames is not None:
        (bin_dir / "scontrol").write_text(
            f"#!{BASH}\n"
            f'if [ "$1" = requeue ]; then echo "$*" >> {tmp_path}/scontrol.calls; exit 0; fi\n'
            f"printf '%s' {shlex.quote(hostnames)}\n"
        )
    (bin_dir / "srun").write_text(
        f"#!{BASH}\n"
        f"[ -e {tmp_path}/srun.args ] || printf '%s\\0' \"$@\" > {tmp_path}/srun.args\n"
        f"echo x >> {tmp_path}/srun.count\n"
        f"exit {srun_rc}\n"
    )
    (bin_dir / "fakepy").write_text(
        f'#!{BASH}\nif [ "$2" = olmx.events ]; then echo "fake outcome {events_rc}"; exit {events_rc}; fi\nexit 9\n'
    )
    (bin_dir / "apptainer").write_text(
        f"#!{BASH}\n"
        f"if [ ! -e {tmp_path}/apptainer.args ]; then\n"
        f"    printf '%s\\0' \"$@\" > {tmp_path}/apptainer.args\n"
        f'    for v in ${{!APPTAINERENV_@}}; do printf \'%s=%s\\n\' "$v" "${{!v}}"; done > {tmp_path}/apptainer.env\n'
        f"fi\n"
        f'case "$*" in *olmx.events*) exit {events_rc} ;; esac\n'
        f"exit {srun_rc}\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def _run_script(
    script: str, tmp_path: Path, bin_dir: Path, job_id: int = 12345, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sh"
    path.write_text(script)
    env = {
        "PATH": str(bin_dir),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_CPUS_PER_NODE": "96(x2)",
        **env_vars,
    }
    return subprocess.run([BASH, str(path)], capture_output=True, text=True, env=env, timeout=30)


def _argv(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def test_script_hands_srun_the_rendezvous_and_the_exact_worker_argv(tmp_path: Path) -> None:
    worker = ["/opt/py/bin/python", "-c", "print('a b', \"$HOME\")", "--flag=x y"]
    script = jobs.render_sbatch(run_dir=tmp_path, command=worker, nproc_per_node=3, python="/opt/py/bin/python")
    proc = _run_script(script, tmp_path, _fake_slurm(tmp_path, hostnames="node-a\nnode-b\n", srun_rc=7))
    assert proc.returncode == 7, proc.stderr
    port = jobs.PORT_BASE + 12345 % jobs.PORT_SPAN
    assert f"rendezvous node-a:{port}" in proc.stdout
    assert "srun exited with status 7" in proc.stdout
    assert "96 CPUs per node's task (restart 0)" in proc.stdout
    argv = _argv(tmp_path / "srun.args")
    assert argv == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=96",
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


@pytest.mark.parametrize(
    ("cpus_per_task", "cpus_per_node", "expected"),
    [
        (None, "96(x2)", 96),
        (None, "64(x2),32", 32),  # nodes differ: the smallest, or srun would refuse the step
        (None, "48,128(x3)", 48),
        (None, "7", 7),
        (8, "96(x2)", 8),  # infra.cpus_per_task stands whatever the allocation has
        (None, "", None),
        (None, "lots", None),
    ],
)
def test_srun_gets_the_cpus_of_each_node(
    tmp_path: Path, cpus_per_task: int | None, cpus_per_node: str, expected: int | None
) -> None:
    script = jobs.render_sbatch(run_dir=tmp_path, command="true", nproc_per_node=2, cpus_per_task=cpus_per_task)
    proc = _run_script(
        script, tmp_path, _fake_slurm(tmp_path, hostnames="node-a"), SLURM_JOB_CPUS_PER_NODE=cpus_per_node
    )
    if expected is None:
        assert proc.returncode == 1
        assert f"cannot read the CPUs per node from SLURM_JOB_CPUS_PER_NODE='{cpus_per_node}'" in proc.stderr
        assert not (tmp_path / "srun.args").exists()
        return
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "srun.args")[:4] == [
        "--nodes=2",
        "--ntasks-per-node=1",
        f"--cpus-per-task={expected}",
        "--kill-on-bad-exit=1",
    ]
    assert f", {expected} CPUs per node's task" in proc.stdout


@pytest.mark.parametrize(
    ("restart_count", "events_rc", "requeued", "rc"),
    [
        ("", 75, True, 0),  # first run, stopped with a checkpoint: requeue 1 of at most 2
        ("1", 75, True, 0),
        ("2", 75, False, 75),  # the cap: exit 75, not requeued
        ("7", 75, False, 75),  # Slurm's own requeues count too
        ("0", 76, False, 76),  # a non-finite stop is never requeued
        ("0", 77, False, 77),  # nor a hang (the watchdog's verdict; srun says 1): rerun to resume
        ("0", 1, False, 3),  # a failure keeps srun's status
    ],
)
def test_requeue_stops_at_max_requeues(
    tmp_path: Path, restart_count: str, events_rc: int, requeued: bool, rc: int
) -> None:
    script = jobs.render_sbatch(
        run_dir=tmp_path, command="true", nproc_per_node=1, python="fakepy", requeue=True, max_requeues=2
    )
    bin_dir = _fake_slurm(tmp_path, hostnames="node-a", srun_rc=3, events_rc=events_rc)
    env = {"SLURM_RESTART_COUNT": restart_count} if restart_count else {}
    proc = _run_script(script, tmp_path, bin_dir, **env)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    calls = (tmp_path / "scontrol.calls").read_text() if (tmp_path / "scontrol.calls").exists() else ""
    assert calls == ("requeue 12345\n" if requeued else "")
    if requeued:
        n = int(restart_count or 0) + 1
        assert f"requeueing job 12345 to resume it (requeue {n} of at most 2)" in proc.stdout
    if not requeued and events_rc == 75:
        assert (
            f"job 12345 has been requeued {restart_count} time(s) (infra.max_requeues=2): not requeueing it again"
        ) in proc.stderr
    assert f"restart {restart_count or 0})" in proc.stdout


def test_requeue_without_a_cap_and_without_requeue(tmp_path: Path) -> None:
    bin_dir = _fake_slurm(tmp_path, hostnames="node-a", srun_rc=3, events_rc=75)
    uncapped = jobs.render_sbatch(run_dir=tmp_path, command="true", nproc_per_node=1, python="fakepy", requeue=True)
    proc = _run_script(uncapped, tmp_path, bin_dir, SLURM_RESTART_COUNT="50")
    assert proc.returncode == 0 and (tmp_path / "scontrol.calls").read_text() == "requeue 12345\n"
    assert "(requeue 51)" in proc.stdout
    (tmp_path / "scontrol.calls").unlink()
    plain = jobs.render_sbatch(run_dir=tmp_path, command="true", nproc_per_node=1, python="fakepy")
    proc = _run_script(plain, tmp_path, bin_dir)
    assert proc.returncode == 75 and not (tmp_path / "scontrol.calls").exists()


def test_apptainer_gets_the_job_environment_and_the_exact_argv(tmp_path: Path) -> None:
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command=["python", "-m", "olmx", "run", "p.yaml"],
        nproc_per_node=2,
        gpus_per_node=2,
        container_runtime="apptainer",
        container_image="/img/t.sif",
        container_mounts=["/data:/data"],
        container_env=["HF_TOKEN", "UNSET_ONE"],
        env={"NCCL_DEBUG": "WARN", "ODD": "a b'$c"},
        requeue=True,
        max_requeues=1,
    )
    bin_dir = _fake_slurm(tmp_path, hostnames="node-a\nnode-b", srun_rc=0)
    proc = _run_script(script, tmp_path, bin_dir, HF_TOKEN="hf_x,y z", SLURM_RESTART_COUNT="1")
    assert proc.returncode == 0, proc.stderr
    port = jobs.PORT_BASE + 12345 % jobs.PORT_SPAN
    assert _argv(tmp_path / "srun.args") == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=96",
        "--gpus-per-node=2",
        "--kill-on-bad-exit=1",
        "apptainer",
        "exec",
        "--nv",
        "--bind=/data:/data",
        f"--pwd={tmp_path}",
        "/img/t.sif",
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=node-a:{port}",
        "--rdzv-id=12345",
        "--no-python",
        "python",
        "-m",
        "olmx",
        "run",
        "p.yaml",
    ]
    # (the srun stand-in does not run apptainer: check the variables the script exported for it)
    env_dump = subprocess.run(
        [BASH, "-c", script.split("cd ", 1)[0] + 'for v in ${!APPTAINERENV_@}; do echo "$v=${!v}"; done'],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "SLURM_JOB_ID": "12345", "SLURM_RESTART_COUNT": "1", "HF_TOKEN": "hf_x,y z"},
    )
    assert env_dump.stdout.splitlines() == [
        "APPTAINERENV_HF_TOKEN=hf_x,y z",
        "APPTAINERENV_NCCL_DEBUG=WARN",
        "APPTAINERENV_ODD=a b'$c",
        "APPTAINERENV_OLMX_LAUNCH_ID=slurm-12345-1",
    ]  # UNSET_ONE is not set, so the image keeps its own value


def test_apptainer_outcome_check_runs_in_the_image_on_the_batch_host(tmp_path: Path) -> None:
    script = jobs.render_sbatch(
        run_dir=tmp_path,
        command="true",
        nproc_per_node=1,
        container_runtime="apptainer",
        container_image="/img/t.sif",
        requeue=True,
        max_requeues=1,
    )
    bin_dir = _fake_slurm(tmp_path, hostnames="node-a", srun_rc=3, events_rc=75)
    proc = _run_script(script, tmp_path, bin_dir, SLURM_RESTART_COUNT="1")
    assert proc.returncode == 75, proc.stdout + proc.stderr  # stopped with a checkpoint, at the cap
    assert _argv(tmp_path / "apptainer.args") == [
        "exec",
        f"--pwd={tmp_path}",
        "/img/t.sif",
        "python",
        "-m",
        "olmx.events",
        str(tmp_path),
        "slurm-12345-1",
    ]
    assert (tmp_path / "apptainer.env").read_text().splitlines() == ["APPTAINERENV_OLMX_LAUNCH_ID=slurm-12345-1"]
    assert (tmp_path / "srun.count").read_text().count("x") == 1  # no srun for the check


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
        (dict(mem="500GB"), "mem"),
        (dict(mem="-1"), "mem"),
        (dict(time="2h"), "time"),
        (dict(signal_seconds=70000), "signal_seconds"),
        (dict(max_requeues=-1), "max_requeues"),
        (dict(gpus_per_node=2, gpu_request="mig"), "gpu_request"),
        (dict(gpus_per_node=2, gpu_type="h100:8"), "gpu_type"),
        (dict(container_image="img", container_runtime="docker"), "container_runtime"),
        (dict(container_image="my image"), "container_image"),
        (dict(container_image="img", container_mounts=["/data"]), "container_mounts"),
        (dict(container_image="img", container_mounts=["data:/data"]), "container_mounts"),
        (dict(container_image="img", container_mounts=["/a:/a,/b:/b"]), "container_mounts"),
        (dict(container_mounts=["/a:/a"]), "container_mounts"),
        (dict(container_env=["HF_TOKEN"]), "container_env"),
        (dict(container_image="img", container_env=["1BAD"]), "container_env"),
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


# ---------------------------------------------------------------- following a job that may be requeued


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_job_end_without_requeue_is_the_first_terminal_state() -> None:
    end = jobs.JobEnd(requeue=False, clock=_Clock())
    assert [end.final(s) for s in ("PENDING", "RUNNING", "COMPLETING")] == [False, False, False]
    for state in sorted(jobs.TERMINAL_STATES):
        assert jobs.JobEnd(requeue=False).final(state), state
    assert end.final("NODE_FAIL") and end.waiting() is None


def test_job_end_with_requeue_waits_for_node_fail_and_preempted_to_come_back() -> None:
    clock = _Clock()
    end = jobs.JobEnd(requeue=True, grace=60, clock=clock)
    assert not end.final("RUNNING")
    assert not end.final("NODE_FAIL")
    clock.now = 59
    assert not end.final("NODE_FAIL") and end.waiting() == 59
    assert not end.final("PENDING") and end.waiting() is None  # it came back
    for state in ("REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "CONFIGURING", "RUNNING"):
        assert not end.final(state), state
    assert not end.final("PREEMPTED")  # a new wait starts
    clock.now = 118
    assert not end.final("PREEMPTED")
    clock.now = 119
    assert end.final("PREEMPTED")  # stayed 60 s: a cluster that does not requeue it
    # The other terminal states are the end at once, requeue or not.
    for state in sorted(jobs.TERMINAL_STATES - jobs.REQUEUABLE_STATES):
        assert jobs.JobEnd(requeue=True, clock=clock).final(state), state


def _fake_squeue(tmp_path: Path, states: list[str], exit_code: str = "0:0") -> Path:
    """`squeue` printing ``states`` one call after the other (the last one from then on) and a
    `scontrol show job` with that state and ``exit_code``."""
    (tmp_path / "states").write_text("\n".join(states) + "\n")
    (tmp_path / "squeue").write_text(
        f"#!{BASH}\n"
        f"n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n\n"
        f's=$(sed -n "$((n + 1))p" {tmp_path}/states); [ -n "$s" ] || s=$(tail -n 1 {tmp_path}/states)\n'
        f'echo "$s" > {tmp_path}/last; echo "$s"\n'
    )
    (tmp_path / "scontrol").write_text(
        f'#!{BASH}\necho "JobId=1 JobState=$(cat {tmp_path}/last) Reason=None ExitCode={exit_code}"\n'
    )
    for name in ("squeue", "scontrol"):
        (tmp_path / name).chmod(0o755)
    return tmp_path


def test_wait_follows_a_requeued_job_to_its_real_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    states = ["PENDING", "RUNNING", "NODE_FAIL", "PENDING", "RUNNING", "COMPLETED"]
    monkeypatch.setenv("PATH", f"{_fake_squeue(tmp_path, states)}:/usr/bin:/bin")
    seen: list[str] = []
    assert jobs.wait("1", on_state=seen.append, poll=0.01, requeue=True, grace=30) == ("COMPLETED", 0)
    assert seen == states
    # Without requeue the same NODE_FAIL is the end.
    (tmp_path / "n").unlink()
    assert jobs.wait("1", poll=0.01, requeue=False) == ("NODE_FAIL", 0)


def test_wait_takes_a_lasting_preempted_as_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_fake_squeue(tmp_path, ['RUNNING', 'PREEMPTED'], '0:15')}:/usr/bin:/bin")
    assert jobs.wait("1", poll=0.01, requeue=True, grace=0.2) == ("PREEMPTED", 143)
    assert int((tmp_path / "n").read_text()) > 3  # asked again during the grace period
