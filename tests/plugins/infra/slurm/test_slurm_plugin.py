"""The ``slurm`` infra plugin without a cluster: its world, its config checks (at resolve,
before anything is written) and the batch script ``--dry-run`` prints. The real cluster runs
are in test_slurm_train.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError, LaunchError
from olmx.plan.resolve import resolve
from olmx.registry import registry
from olmx_plugins.infra.slurm import jobs
from olmx_plugins.infra.slurm.plugin import SLURM, SlurmConfig, SlurmContainerConfig, _JobWatch
from tests.conftest import olmx_cli


def plan_for(tmp_path, *overrides: str):
    reg = registry()
    run = to_object(compose(["infra=slurm", f"trainer.run_dir={tmp_path / 'run'}", *overrides], reg), reg)
    return resolve(run, reg)


def test_world_from_the_settings() -> None:
    cpu = SLURM.world(SlurmConfig())
    assert (cpu.nnodes, cpu.nproc_per_node, cpu.device) == (1, 2, "cpu")
    gpu = SLURM.world(SlurmConfig(nodes=4, gpus_per_node=8, gpu_name="NVIDIA H100 80GB HBM3"))
    assert (gpu.nnodes, gpu.nproc_per_node, gpu.size, gpu.device) == (4, 8, 32, "cuda")
    assert gpu.compute_capability == (9, 0) and gpu.device_name == "NVIDIA H100 80GB HBM3"
    assert SLURM.world(SlurmConfig(gpus_per_node=8, nproc_per_node=4)).nproc_per_node == 4
    assert SLURM.world(SlurmConfig(gpus_per_node=2)).compute_capability is None  # model unknown


def checked_world(cfg: SlurmConfig):
    """What the plan does with the settings: each field's rule (olmx.rules), then world()."""
    from olmx.rules import check

    check(cfg, "infra")
    return SLURM.world(cfg)


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (SlurmConfig(nodes=0), "infra.nodes"),
        (SlurmConfig(gpus_per_node=4, nproc_per_node=8), "infra.nproc_per_node"),
        (SlurmConfig(partition="gpu debug"), "infra.partition"),
        (SlurmConfig(time="1:00 "), "infra.time"),
        (SlurmConfig(env={"1BAD": "x"}), "infra.env"),
        (SlurmConfig(extra_sbatch_args=["-p gpu"]), "infra.extra_sbatch_args"),
        (SlurmConfig(cpus_per_task=0), "infra.cpus_per_task"),
        (SlurmConfig(exclusive=False), "infra.cpus_per_task"),
        (SlurmConfig(mem="500GB"), "infra.mem"),
        (SlurmConfig(time="2h"), "infra.time"),
        (SlurmConfig(signal_seconds=120), "infra.signal_seconds"),
        (SlurmConfig(time="5"), "infra.signal_seconds"),
        (SlurmConfig(time="10", signal_seconds=600), "infra.signal_seconds"),
        (SlurmConfig(stop_timeout=0), "infra.stop_timeout"),
        (SlurmConfig(max_requeues=-1), "infra.max_requeues"),
        (SlurmConfig(gpu_request="gpus"), "infra.gpu_request"),
        (SlurmConfig(gpu_type="h100"), "infra.gpu_type"),
        (SlurmConfig(gpus_per_node=8, gpu_type="h100:8"), "infra.gpu_type"),
        (SlurmConfig(container=SlurmContainerConfig(runtime="docker")), "infra.container.runtime"),
        (SlurmConfig(container=SlurmContainerConfig(image="i", mounts=["/data"])), "infra.container.mounts"),
        (SlurmConfig(container=SlurmContainerConfig(mounts=["/a:/a"])), "infra.container.mounts"),
        (SlurmConfig(container=SlurmContainerConfig(image="i", env=["A-B"])), "infra.container.env"),
        (SlurmConfig(container=SlurmContainerConfig(image="my image")), "infra.container.image"),
        (SlurmConfig(container_image="img"), "infra.container_image"),
        (SlurmConfig(container_mounts="/a:/a"), "infra.container_mounts"),
        (SlurmConfig(extra_sbatch_args=["--mem=64G"]), "infra.extra_sbatch_args"),
        (SlurmConfig(extra_sbatch_args=["--exclusive"]), "infra.extra_sbatch_args"),
        (SlurmConfig(extra_sbatch_args=["--cpus-per-task=4"]), "infra.extra_sbatch_args"),
        (SlurmConfig(extra_sbatch_args=["--gres=gpu:a100:2"]), "infra.extra_sbatch_args"),
        (SlurmConfig(extra_sbatch_args=["--signal=USR1@60"]), "infra.extra_sbatch_args"),
        (SlurmConfig(mem="64G", extra_sbatch_args=["--mem-per-gpu=80G"]), "infra.extra_sbatch_args"),
    ],
)
def test_bad_settings_name_their_key(cfg: SlurmConfig, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        checked_world(cfg)
    assert info.value.field == key


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (SlurmConfig(gpu_request="gpus"), "'gpus' is not one of gpus-per-node, gres"),
        (
            SlurmConfig(container=SlurmContainerConfig(runtime="docker")),
            "'docker' is not one of pyxis, apptainer, singularity",
        ),
        (
            SlurmConfig(signal_seconds=120),
            "120 s is less than infra.stop_timeout=300 s, the time the workers get to save a checkpoint after "
            "SIGTERM; set at least 300 (null: 360) or lower infra.stop_timeout",
        ),
        (
            SlurmConfig(time="5"),
            "360 s (infra.stop_timeout + 60) is not shorter than infra.time=5 (300 s): the job would be told to "
            "stop as soon as it starts; raise infra.time or lower infra.stop_timeout",
        ),
        (SlurmConfig(exclusive=False), "with infra.exclusive=false set the CPUs of each node's task"),
        (SlurmConfig(mem="500GB"), "Slurm's --mem takes a whole number with an optional unit K, M, G or T"),
        (SlurmConfig(container_image="x"), "replaced by infra.container.image"),
        (SlurmConfig(extra_sbatch_args=["--mem=64G"]), "'--mem=64G' is set by olmx: use infra.mem"),
        (
            SlurmConfig(extra_sbatch_args=["--gres=gpu:2"]),
            "'--gres=gpu:2' is set by olmx: use infra.gpus_per_node with infra.gpu_request=gres",
        ),
    ],
)
def test_bad_settings_say_what_is_allowed(cfg: SlurmConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        checked_world(cfg)


def test_settings_that_are_allowed() -> None:
    # Shorter jobs: a lower stop_timeout lowers the default signal time with it.
    SLURM.world(SlurmConfig(time="5", stop_timeout=60))
    SLURM.world(SlurmConfig(time="10", signal_seconds=300))
    SLURM.world(SlurmConfig(exclusive=False, cpus_per_task=8, mem="64G"))
    SLURM.world(SlurmConfig(exclusive=False, cpus_per_task=8, extra_sbatch_args=["--exclusive=user"]))
    SLURM.world(SlurmConfig(extra_sbatch_args=["--gres=nvme:1", "--mem-per-gpu=80G", "--qos=high"]))
    SLURM.world(SlurmConfig(gpus_per_node=8, gpu_request="gres", gpu_type="h100", time="UNLIMITED"))
    SLURM.world(SlurmConfig(container=SlurmContainerConfig(runtime="apptainer", image="/i.sif", mounts=["/a:/b:ro"])))


def test_bad_setting_fails_at_resolve_and_writes_nothing(tmp_path) -> None:
    with pytest.raises(ConfigError, match="infra.partition"):
        plan_for(tmp_path, "infra.partition='gpu debug'")
    assert not (tmp_path / "run").exists()


def test_dry_run_is_the_batch_script_of_a_multi_node_gpu_job(tmp_path) -> None:
    plan = plan_for(
        tmp_path,
        "infra.nodes=2",
        "infra.gpus_per_node=8",
        "infra.gpu_name='NVIDIA B200'",
        "infra.partition=gpu",
        "infra.account=ai2",
        "infra.time=02:00:00",
        "infra.cpus_per_task=96",
        "infra.signal_seconds=400",
        "infra.requeue=true",
        "infra.max_requeues=10",
        "infra.python=/opt/venv/bin/python",
        "+infra.env.NCCL_DEBUG=WARN",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=1",
    )
    assert (plan.world.size, plan.world.compute_capability) == (16, (10, 0))
    script = SLURM.dry_run(plan.infra, plan)
    assert script == SLURM.script(plan.infra, plan)
    run = tmp_path / "run"
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ai2",
        "#SBATCH --time=02:00:00",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --mem=0",
        "#SBATCH --signal=B:TERM@400",
        "#SBATCH --requeue",
        f"#SBATCH --output={run}/slurm-%j.out",
        "export NCCL_DEBUG=WARN",
        "export PYTHONUNBUFFERED=1",
        "CPUS_PER_TASK=96",
        "    /opt/venv/bin/python -m torch.distributed.run \\",
        '    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=8 \\',
        f"    /opt/venv/bin/python -m olmx run {run}/plan.yaml &",
        '        if [ "${SLURM_RESTART_COUNT:-0}" -ge 10 ]; then',
    ):
        assert line in script.splitlines(), line
    assert ' --cpus-per-task="$CPUS_PER_TASK" --gpus-per-node=8 --kill-on-bad-exit=1 \\' in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def _options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def _infra(tmp_path, *overrides: str):
    plan = plan_for(tmp_path, *overrides)
    return plan.infra, plan


def test_defaults_give_the_task_the_whole_node(tmp_path) -> None:
    plan = plan_for(tmp_path)
    script = SLURM.dry_run(plan.infra, plan)
    lines = script.splitlines()
    assert f"    {sys.executable} -m olmx run {tmp_path / 'run'}/plan.yaml &" in lines
    assert "--gpus-per-node" not in script and "--partition" not in script and "--gres" not in script
    # The nodes alone, all their CPUs and memory, SIGTERM stop_timeout + 60 s before the limit.
    assert _options(script)[5:] == ["--exclusive", "--mem=0", "--signal=B:TERM@360"]
    assert (
        "# CPUs of each node's task (torchrun and its workers): all of the node's (--exclusive), given to srun too."
    ) in lines
    assert "# Memory of each node: all of it (--mem=0)." in lines
    assert '--cpus-per-task="$CPUS_PER_TASK"' in script and "CPUS_PER_TASK=$_count" in script
    assert "scontrol requeue" not in script  # infra.requeue is off by default
    # stop_timeout moves the default signal time.
    assert "#SBATCH --signal=B:TERM@180" in SLURM.dry_run(*_infra(tmp_path, "infra.stop_timeout=120")).splitlines()


def test_shared_nodes_with_explicit_cpus_and_memory(tmp_path) -> None:
    script = SLURM.dry_run(*_infra(tmp_path, "infra.exclusive=false", "infra.cpus_per_task=8", "infra.mem=64G"))
    assert _options(script)[5:] == ["--cpus-per-task=8", "--mem=64G", "--signal=B:TERM@360"]
    assert "CPUS_PER_TASK=8" in script.splitlines() and "SLURM_JOB_CPUS_PER_NODE" not in script
    # --mem-per-gpu replaces the default --mem=0 (Slurm takes only one of them).
    per_gpu = SLURM.dry_run(*_infra(tmp_path, "infra.gpus_per_node=1", "infra.extra_sbatch_args=['--mem-per-gpu=80G']"))
    assert "--mem=" not in per_gpu and "#SBATCH --mem-per-gpu=80G" in per_gpu.splitlines()


def test_gres_gpus_with_a_type(tmp_path) -> None:
    script = SLURM.dry_run(
        *_infra(
            tmp_path,
            "infra.gpus_per_node=4",
            "infra.gpu_request=gres",
            "infra.gpu_type=a100",
            "trainer.global_batch_size=32",
            "trainer.micro_batch_size=1",
        )
    )
    assert "#SBATCH --gres=gpu:a100:4" in script.splitlines() and "--gpus-per-node" not in script
    assert ' --cpus-per-task="$CPUS_PER_TASK" --gres=gpu:a100:4 --kill-on-bad-exit=1' in script


def test_container_default_python_is_the_images(tmp_path) -> None:
    run = tmp_path / "run"
    script = SLURM.dry_run(
        *_infra(
            tmp_path,
            "infra.container.image=/images/torch.sqsh",
            f"infra.container.mounts=[{tmp_path}:{tmp_path}]",
            "infra.container.env=[HF_TOKEN]",
        )
    )
    assert f"    python -m olmx run {run}/plan.yaml &" in script.splitlines()
    assert sys.executable not in script
    assert (
        f" --container-image=/images/torch.sqsh --container-name=olmx --container-mounts={tmp_path}:{tmp_path} "
        f"--container-workdir={run} "
        "--container-env=HF_TOKEN,OLMX_LAUNCH_ID,PET_SHUTDOWN_TIMEOUT,PYTHONSAFEPATH,PYTHONUNBUFFERED \\"
    ) in script
    apptainer = SLURM.dry_run(
        *_infra(tmp_path, "infra.container.runtime=apptainer", "infra.container.image=/images/torch.sif")
    )
    assert f"    apptainer exec --pwd={run} /images/torch.sif python -m torch.distributed.run \\" in apptainer
    # An explicit infra.python stands.
    explicit = SLURM.dry_run(*_infra(tmp_path, "infra.container.image=/i.sqsh", "infra.python=/venv/bin/python"))
    assert "    /venv/bin/python -m torch.distributed.run \\" in explicit.splitlines()


def test_multi_node_script_runs_with_every_variable_filled(tmp_path) -> None:
    """The plugin's own script for 2 GPU nodes in an Apptainer image, run by bash with stand-ins
    for scontrol and srun and the variables Slurm sets: every word srun gets. (No multi-node
    cluster is available to the tests; this is the check of what would run on one.)"""
    plan = plan_for(
        tmp_path,
        "infra.nodes=2",
        "infra.gpus_per_node=4",
        "infra.gpu_request=gres",
        "infra.gpu_type=h100",
        "infra.container.runtime=apptainer",
        "infra.container.image=/images/t.sif",
        f"infra.container.mounts=[{tmp_path}:{tmp_path}]",
        "infra.requeue=true",
        "trainer.global_batch_size=32",
        "trainer.micro_batch_size=1",
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "sbatch.sh").write_text(SLURM.script(plan.infra, plan))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-017\\ngpu-018\\n'\n")
    (bin_dir / "srun").write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {tmp_path}/srun.args\n")
    (bin_dir / "head").symlink_to("/usr/bin/head")
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = {
        "PATH": str(bin_dir),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-[017-018]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_CPUS_PER_NODE": "112(x2)",
        "SLURM_RESTART_COUNT": "2",
    }
    proc = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(run / "sbatch.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    port = jobs.PORT_BASE + 4242 % jobs.PORT_SPAN
    assert proc.stdout.splitlines()[0] == (
        f"olmx: job 4242 on 2 node(s) [gpu-[017-018]], rendezvous gpu-017:{port}, 112 CPUs per node's task (restart 2)"
    )
    assert Path(tmp_path / "srun.args").read_text().split("\0")[:-1] == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=112",
        "--gres=gpu:h100:4",
        "--kill-on-bad-exit=1",
        "apptainer",
        "exec",
        "--nv",
        f"--bind={tmp_path}:{tmp_path}",
        f"--pwd={run}",
        "/images/t.sif",
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--max-restarts=0",
        f"--log-dir={run}/logs/torchrun",
        "--tee=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=gpu-017:{port}",
        "--rdzv-id=4242",
        "--no-python",
        "python",
        "-m",
        "olmx",
        "run",
        f"{run}/plan.yaml",
    ]


def test_old_container_keys_and_bad_runtime_fail_the_cli_with_exit_2(tmp_path) -> None:
    old = olmx_cli(
        "train", "infra=slurm", "infra.container_image=/i.sqsh", f"trainer.run_dir={tmp_path}/r", "--dry-run"
    )
    assert old.returncode == 2, old.stdout + old.stderr
    assert "infra.container_image: replaced by infra.container.image" in old.stderr
    bad = olmx_cli(
        "train", "infra=slurm", "infra.container.runtime=docker", f"trainer.run_dir={tmp_path}/r", "--dry-run"
    )
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "infra.container.runtime: 'docker' is not one of pyxis, apptainer, singularity" in bad.stderr
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- following the job


class _FakeSlurm:
    """Answers job_details from a list of (JobState, Restarts[, ExitCode]), one per question."""

    def __init__(self, answers: list[tuple[str, ...]]) -> None:
        self.answers = answers
        self.asked = 0

    def __call__(self, job_id: str) -> dict[str, str]:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        state, restarts, code = (*answer, "0:0")[:3]
        return {"JobState": state, "Reason": "None", "Restarts": restarts, "ExitCode": code}


def _watch(monkeypatch, answers, *, requeue: bool, grace: float | None = None):
    fake = _FakeSlurm(answers)
    monkeypatch.setattr(jobs, "job_details", fake)
    said: list[str] = []
    watch = _JobWatch("77", 0.0, requeue=requeue, say=said.append)
    if grace is not None:
        watch._end.grace = grace
    return watch, said, fake


def test_follower_stays_with_a_job_through_its_requeues(monkeypatch) -> None:
    answers = [
        ("PENDING", "0"),
        ("RUNNING", "0"),
        ("COMPLETING", "0"),
        ("REQUEUED", "1"),
        ("PENDING", "1"),
        ("RUNNING", "1"),
        ("NODE_FAIL", "1", "0:9"),
        ("PENDING", "2"),
        ("REQUEUE_HOLD", "2"),
        ("PENDING", "2"),
        ("RUNNING", "2"),
        ("COMPLETED", "2"),
    ]
    watch, said, fake = _watch(monkeypatch, answers, requeue=True, grace=30)
    assert watch.queued() and not watch.queued()  # PENDING, then RUNNING
    codes = [watch.poll() for _ in range(len(answers) - 2)]
    assert codes == [None] * (len(answers) - 3) + [0]
    assert said == [
        "Slurm job 77 was requeued (restart 1); it resumes from its last checkpoint when it runs again",
        "Slurm job 77 is NODE_FAIL; waiting up to 30 s for Slurm to requeue it",
        "Slurm job 77 was requeued (restart 2); it resumes from its last checkpoint when it runs again",
        "Slurm job 77 is REQUEUE_HOLD (reason None): Slurm holds it until `scontrol release 77`; "
        "Ctrl-C stops following",
    ]


def test_follower_without_requeue_ends_at_node_fail(monkeypatch) -> None:
    watch, said, _ = _watch(monkeypatch, [("RUNNING", "0"), ("NODE_FAIL", "0", "0:9")], requeue=False)
    assert not watch.queued()
    assert watch.poll() == 137 and watch.state == "NODE_FAIL" and said == []


def test_follower_takes_a_lasting_preempted_as_the_end(monkeypatch) -> None:
    watch, said, _ = _watch(monkeypatch, [("RUNNING", "0"), ("PREEMPTED", "0", "0:15")], requeue=True, grace=0.0)
    assert not watch.queued()
    assert watch.poll() == 143
    assert said == ["Slurm job 77 is PREEMPTED; waiting up to 0 s for Slurm to requeue it"]
    # A job that failed is no COMPLETED: its own code, or 1.
    failed, _, _ = _watch(monkeypatch, [("FAILED", "0", "0:0")], requeue=True)
    assert failed.poll() == 1


def test_jobs_commands_need_a_submitted_job(tmp_path) -> None:
    plan = plan_for(tmp_path)
    for call in (
        lambda: SLURM.job_status(plan.infra, plan),
        lambda: SLURM.job_logs(plan.infra, plan, 5),
        lambda: SLURM.job_cancel(plan.infra, plan),
    ):
        with pytest.raises(LaunchError, match="was not launched on Slurm"):
            call()
