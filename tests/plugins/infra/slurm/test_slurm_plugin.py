"""The ``slurm`` infra plugin without a cluster: its world, its config checks (at resolve,
before anything is written) and the batch script ``--dry-run`` prints. The real cluster runs
are in test_slurm_train.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError, LaunchError
from olmx.plan.resolve import resolve
from olmx.registry import registry
from olmx_plugins.infra.slurm.plugin import SLURM, SlurmConfig


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
    ],
)
def test_bad_settings_name_their_key(cfg: SlurmConfig, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        SLURM.world(cfg)
    assert info.value.field == key


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
        "infra.signal_seconds=120",
        "infra.requeue=true",
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
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --signal=B:TERM@120",
        "#SBATCH --requeue",
        f"#SBATCH --output={run}/slurm-%j.out",
        "export NCCL_DEBUG=WARN",
        "export PYTHONUNBUFFERED=1",
        "    /opt/venv/bin/python -m torch.distributed.run \\",
        '    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=8 \\',
        f"    /opt/venv/bin/python -m olmx run {run}/plan.yaml &",
    ):
        assert line in script.splitlines(), line
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_default_python_is_the_one_running_olmx(tmp_path) -> None:
    plan = plan_for(tmp_path)
    script = SLURM.dry_run(plan.infra, plan)
    assert f"    {sys.executable} -m olmx run {tmp_path / 'run'}/plan.yaml &" in script.splitlines()
    assert "--gpus-per-node" not in script and "--partition" not in script


def test_jobs_commands_need_a_submitted_job(tmp_path) -> None:
    plan = plan_for(tmp_path)
    for call in (
        lambda: SLURM.job_status(plan.infra, plan),
        lambda: SLURM.job_logs(plan.infra, plan, 5),
        lambda: SLURM.job_cancel(plan.infra, plan),
    ):
        with pytest.raises(LaunchError, match="was not launched on Slurm"):
            call()
