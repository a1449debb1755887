"""The ``runpod`` infra plugin's parts without training: its world and config checks, the
``--dry-run`` text, what it ships to a pod, the dependency pins, and the SSH steps (watch,
state, fetch, kill) against a "pod" directory reached through the stand-in ssh."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from runpod_testing import KEY

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError
from olmx.plan.resolve import resolve
from olmx.registry import registry
from olmx.rundir import RunDir
from olmx_plugins.infra.runpod import creation
from olmx_plugins.infra.runpod import remote as rm
from olmx_plugins.infra.runpod.config import RunPodConfig
from olmx_plugins.infra.runpod.payload import build_bundle, pinned_requirements
from olmx_plugins.infra.runpod.plugin import RUNPOD

GPU8 = ["infra.gpus_per_node=8", "trainer.global_batch_size=16", "trainer.micro_batch_size=1"]


def plan_for(tmp_path: Path, *overrides: str):
    reg = registry()
    run = to_object(compose(["infra=runpod", f"trainer.run_dir={tmp_path / 'run'}", *overrides], reg), reg)
    return resolve(run, reg)


def _cfg_plan(plan):
    """The arguments of RUNPOD's hooks: its typed config and the plan."""
    return plan.infra, plan


def test_world_from_the_settings() -> None:
    gpu = RUNPOD.world(RunPodConfig(gpus_per_node=8, gpu_type="NVIDIA B200"))
    assert (gpu.nnodes, gpu.nproc_per_node, gpu.device, gpu.compute_capability) == (1, 8, "cuda", (10, 0))
    cluster = RUNPOD.world(RunPodConfig(nodes=4, gpus_per_node=8))
    assert (cluster.size, cluster.compute_capability) == (32, (9, 0))  # default: H100
    cpu = RUNPOD.world(RunPodConfig(gpus_per_node=0))
    assert (cpu.nnodes, cpu.nproc_per_node, cpu.device) == (1, 2, "cpu")


@pytest.mark.parametrize(
    ("cfg", "key", "match"),
    [
        (RunPodConfig(env={"HF_TOKEN": "hf_x"}), "infra.env", "looks like a secret"),
        (RunPodConfig(pass_env=["RUNPOD_API_KEY"]), "infra.pass_env", "never goes to a pod"),
        (RunPodConfig(pass_env=["BAD-NAME"]), "infra.pass_env", "not an environment variable name"),
        (RunPodConfig(nodes=2, gpus_per_node=8, pod_id="p1"), "infra.pod_id", "use infra.cluster_id"),
        (RunPodConfig(nodes=2, gpus_per_node=0), "infra.nodes", "GPU pods only"),
        (RunPodConfig(nodes=300, gpus_per_node=8), "infra.nodes", "between 2 and 250"),
        (RunPodConfig(gpus_per_node=2, nproc_per_node=4), "infra.nproc_per_node", "4 processes"),
        (RunPodConfig(cloud="ALL"), "infra.cloud", "SECURE, COMMUNITY"),
        (RunPodConfig(container_disk_gb=0), "infra.container_disk_gb", "positive"),
        (RunPodConfig(min_cuda_version="13"), "infra.min_cuda_version", "12.8"),
        (RunPodConfig(gpus_per_node=0, vcpus=0), "infra.vcpus", "must be an integer >= 2, got 0"),
        (RunPodConfig(gpus_per_node=0, vcpus=6), "infra.vcpus", "power of two and at least 2"),
        (RunPodConfig(gpus_per_node=0, vcpus=1), "infra.vcpus", "must be an integer >= 2, got 1"),
        (RunPodConfig(env={"SSH_PUBLIC_KEY_TOKEN": "x"}), "infra.env", "looks like a secret"),
        (RunPodConfig(env={"HF_TOKEN": "x"}), "infra.env", "infra.secrets.HF_TOKEN=<secret name>"),
        (RunPodConfig(secrets={"HF_TOKEN": "my token"}), "infra.secrets", "not a RunPod secret name"),
        (RunPodConfig(secrets={"bad-name": "tok"}), "infra.secrets", "not an environment variable name"),
        (
            RunPodConfig(secrets={"HF_TOKEN": "hf"}, pass_env=["HF_TOKEN"]),
            "infra.pass_env",
            "also set in infra.secrets",
        ),
        (RunPodConfig(gpu_type="NVIDIA H200", gpu_types=["NVIDIA B200"]), "infra.gpu_types", "SM100, but the plan is"),
        (RunPodConfig(gpu_types=["NVIDIA L40S"]), "infra.gpu_types", "44.5 GiB memory, less than"),
        (RunPodConfig(gpu_type="NVIDIA H200", gpu_types=["NVIDIA H100 80GB HBM3"]), "infra.gpu_types", "79.6 GiB"),
        (RunPodConfig(gpu_types=["NVIDIA H200"], gpus_per_node=0), "infra.gpu_types", "a CPU pod"),
        (RunPodConfig(ssh_wait_timeout=0), "infra.ssh_wait_timeout", "must be a positive finite number, got 0"),
        (
            RunPodConfig(env={f"V{i}": "1" for i in range(40)}, pass_env=[f"P{i}" for i in range(11)]),
            "infra.env",
            "51 environment variables; RunPod takes at most 50",
        ),
    ],
)
def test_bad_settings_name_their_key(cfg: RunPodConfig, key: str, match: str) -> None:
    from olmx.rules import check

    with pytest.raises(ConfigError, match=match) as info:
        check(cfg, "infra")  # each field's rule, as the plan checks it before world()
        RUNPOD.world(cfg)
    assert info.value.field == key


def test_clusters_default_to_eight_gpus_per_node_and_one_pod_to_one() -> None:
    cluster = RUNPOD.world(RunPodConfig(nodes=2))
    assert (cluster.nnodes, cluster.nproc_per_node) == (2, 8)
    path, body = creation.request(RunPodConfig(nodes=2), name="c", env={})
    assert path == "/v2/clusters" and body["compute"]["gpuCountPerPod"] == 8
    assert RUNPOD.world(RunPodConfig()).nproc_per_node == 1
    assert RUNPOD.world(RunPodConfig(nodes=2, gpus_per_node=4)).nproc_per_node == 4


def test_candidates_are_each_gpu_type_in_each_data_centre_in_order() -> None:
    cfg = RunPodConfig(
        gpus_per_node=8, gpu_types=["NVIDIA H200", "NVIDIA H100 80GB HBM3"], data_centers=["US-TX-3", "EU-RO-1"]
    )
    RUNPOD.world(cfg)  # H200 is SM90 as the H100: accepted; the repeated H100 is tried once
    tries = creation.candidates(cfg, name="p", env={})
    assert [label for label, _ in tries] == [
        "8 x NVIDIA H100 80GB HBM3 in US-TX-3",
        "8 x NVIDIA H100 80GB HBM3 in EU-RO-1",
        "8 x NVIDIA H200 in US-TX-3",
        "8 x NVIDIA H200 in EU-RO-1",
    ]
    assert [(t.gpu_type_id, t.data_center_ids) for _, t in tries][2] == ("NVIDIA H200", ("US-TX-3",))
    assert [label for label, _ in creation.candidates(RunPodConfig(), name="p", env={})] == [
        "1 x NVIDIA H100 80GB HBM3 in any data centre"
    ]


def test_secrets_reach_the_pod_as_runpod_references_and_pass_env_is_flagged(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MY_VALUE", "very-private-value")
    plan = plan_for(tmp_path, *GPU8, "+infra.secrets.HF_TOKEN=hf_read", "infra.pass_env=[MY_VALUE]")
    env = creation.pod_env(plan.infra)
    assert env == {"HF_TOKEN": "{{ RUNPOD_SECRET_hf_read }}", "MY_VALUE": "very-private-value"}
    text = RUNPOD.dry_run(plan.infra, plan)
    assert '"HF_TOKEN": "{{ RUNPOD_SECRET_hf_read }}"' in text and "very-private-value" not in text
    assert "the values of MY_VALUE (infra.pass_env) are kept there in plain text" in text
    assert "hf_read" in json.dumps(plan.to_dict())  # the secret's name is in the plan, its value nowhere
    quiet = plan_for(tmp_path, *GPU8, "+infra.secrets.HF_TOKEN=hf_read")
    assert "plain text" not in RUNPOD.dry_run(quiet.infra, quiet)


def test_public_keys_are_not_secrets_and_power_of_two_vcpus_pass() -> None:
    from olmx_plugins.infra.runpod.transport import looks_secret, redacted_request

    assert not looks_secret("PUBLIC_KEY") and not looks_secret("SSH_PUBKEY")
    assert looks_secret("HF_TOKEN") and looks_secret("AWS_SECRET_ACCESS_KEY") and looks_secret("PUBLIC_KEY_PASSWORD")
    RUNPOD.world(RunPodConfig(env={"PUBLIC_KEY": "ssh-ed25519 AAAA me"}))  # accepted
    for vcpus in (2, 4, 8, 32):
        RUNPOD.world(RunPodConfig(gpus_per_node=0, vcpus=vcpus))
    shown = redacted_request("POST", "/pods", {"env": {"PUBLIC_KEY": "ssh-ed25519 AAAA me", "HF_TOKEN": "hf_x"}})
    assert "ssh-ed25519 AAAA me" in shown and "hf_x" not in shown


def test_dry_run_shows_request_bootstrap_and_steps_without_secrets(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    monkeypatch.setenv("MY_VALUE", "very-private-value")
    plan = plan_for(tmp_path, *GPU8, "+infra.env.WANDB_MODE=offline", "infra.pass_env=[MY_VALUE]")
    text = RUNPOD.dry_run(plan.infra, plan)
    request = text[text.index("POST ") : text.index("\n\n# 2.")]
    head, _, body = request.partition("\n\n")
    assert head.splitlines() == [
        "POST https://api.runpod.io/v2/pods",
        "Authorization: Bearer <redacted>",
        "Content-Type: application/json",
    ]
    assert json.loads(body) == {
        "name": "olmx-run",
        "image": "runpod/pytorch:1.2.0-cu1300-torch2130-ubuntu2404",
        "gpu": {"id": "NVIDIA H100 80GB HBM3", "count": 8, "minCudaVersion": "13.0"},
        "cloud": "SECURE",
        "disk": 100,
        "ports": ["22/tcp"],
        "startSsh": True,
        "env": {"WANDB_MODE": "offline", "MY_VALUE": "<redacted: $MY_VALUE of the launching environment>"},
    }
    assert RUNPOD.bootstrap(plan.infra, plan) in text
    assert '"action": "stop"' in text
    assert KEY not in text and "very-private-value" not in text
    assert "very-private-value" not in (json.dumps(plan.to_dict()))  # never in the plan either


def test_bootstrap_is_valid_bash_and_uses_c10d_on_clusters(tmp_path) -> None:
    single = RUNPOD.bootstrap(*_cfg_plan(plan_for(tmp_path, *GPU8)))
    cluster = RUNPOD.bootstrap(*_cfg_plan(plan_for(tmp_path, *GPU8, "infra.nodes=2", "trainer.global_batch_size=32")))
    for script in (single, cluster):
        path = tmp_path / "b.sh"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
        assert "--only-binary=:all:" in script and "--constraint" in script
    assert '"--rdzv-endpoint=${MASTER_ADDR:?}:${MASTER_PORT:-29500}" --rdzv-id=olmx-run' in cluster
    assert "--nproc-per-node=8" in cluster
    cpu = RUNPOD.bootstrap(*_cfg_plan(plan_for(tmp_path, "infra.gpus_per_node=0", "infra.install=false")))
    assert "flash" not in cpu.split("set -e", 1)[1] and "pip install" not in cpu


def test_shipped_bundle_holds_the_pods_plan_the_source_and_the_resume_checkpoint(tmp_path) -> None:
    plan = plan_for(tmp_path, *GPU8, "infra.workdir=/data/olmx")
    names = _names(build_bundle(plan, plan.infra))
    assert {
        "run/plan.yaml",
        "bootstrap.sh",
        "constraints.txt",
        "olmx-src/pyproject.toml",
        "olmx-src/olmx/cli.py",
        "olmx-src/templates/runpod/bootstrap.sh.j2",
    } <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith("run/checkpoints")]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(build_bundle(plan, plan.infra)))) as tar:
        pod_plan = tar.extractfile("run/plan.yaml").read().decode()
    assert "run_dir: /data/olmx/run" in pod_plan and str(tmp_path) not in pod_plan
    # A run that resumes ships its checkpoint and metrics.
    step = tmp_path / "run" / "checkpoints" / "step6"
    step.mkdir(parents=True)
    (step / ".metadata.json").write_text("{}")
    (step / "__0_0.distcp").write_bytes(b"shard")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 6}\n')
    RunDir(tmp_path / "run").claim()  # a run directory of olmx's (the marker), as a real run leaves it
    plan = plan_for(tmp_path, *GPU8, "infra.install=false")
    assert plan.resume_step == 6
    names = _names(build_bundle(plan, plan.infra))
    assert {"run/checkpoints/step6/.metadata.json", "run/checkpoints/step6/__0_0.distcp", "run/metrics.jsonl"} <= names
    assert not [n for n in names if n.startswith("olmx-src")]


def _names(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        return {m.name for m in tar.getmembers() if m.isfile()}


def test_pins_are_the_installed_dependency_closure_without_torch() -> None:
    pins = pinned_requirements()
    names = {p.split("==")[0] for p in pins}
    assert "ai2-olmo-core==3.0.0" in pins and {"hydra-core", "omegaconf", "typer", "rich"} <= names
    assert not names & {"torch", "olmx", "triton"} and not any(n.startswith("nvidia-") for n in names)


def test_the_bootstrap_accepts_an_image_torch_in_olmxs_range_and_refuses_others(tmp_path) -> None:
    """The pod checks its image's torch (read from metadata, here this environment's) against
    the range olmx declares (pyproject's torch>=A,<B), not one exact pin: CUDA images of any
    supported release train."""
    import re

    import torch

    from olmx_plugins.infra.runpod.payload import render_bootstrap, torch_range

    assert torch_range() == ("2.11", "2.14")
    plan = plan_for(tmp_path, "infra.gpus_per_node=0")
    script = render_bootstrap(plan.infra, plan)
    (check,) = re.findall(r"<<'EOF'\n(.*?)\nEOF\n", script, re.S)
    have = torch.__version__.split("+")[0]
    for lowest, below, ok in (("2.11", "2.14", True), ("2.14", "2.15", False), ("2.0", have, False)):
        proc = subprocess.run([sys.executable, "-", lowest, below], input=check, capture_output=True, text=True)
        assert (proc.returncode == 0) is ok, proc.stderr
        if not ok:
            assert f"olmx supports >={lowest},<{below}: choose another infra.image" in proc.stderr
    assert "OLMO_DISABLE_PER_RANK_TRITON_CACHE" not in script  # GPU pods keep OLMo-core's per-rank Triton cache


# ------------------------------------------------------------------------ the SSH steps


@pytest.fixture
def pod(tmp_path, fake_ssh, monkeypatch):
    for key, value in fake_ssh.items():
        monkeypatch.setenv(key, value)
    work = tmp_path / "pod"
    (work / "run" / "logs").mkdir(parents=True)
    (work / "status").mkdir()
    return rm.Remote("203.0.113.7", 40001, known_hosts=str(tmp_path / "kh")), work


def test_watch_mirrors_new_bytes_and_reports_the_exit_status(tmp_path, pod) -> None:
    remote, work = pod
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # like setsid in the bootstrap
    try:
        (work / "status" / "pid.node0").write_text(str(sleeper.pid))
        watch = rm.Watch(remote, str(work), tmp_path / "local")
        watch.reset()
        metrics, log = work / "run" / "metrics.jsonl", work / "run" / "logs" / "node0.log"
        assert watch.look() is None  # running, nothing written yet
        metrics.write_text('{"step": 1}\n')
        log.write_bytes(b"caf\xc3\xa9 \xff raw bytes\n")
        assert watch.look() is None
        with open(metrics, "a") as f:
            f.write('{"step": 2}\n')
        assert watch.look() is None
        assert (tmp_path / "local" / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
        assert (tmp_path / "local" / "logs" / "node0.log").read_bytes() == b"caf\xc3\xa9 \xff raw bytes\n"
        metrics.write_text('{"step": 7}\n')  # truncated and rewritten (a resumed run)
        assert watch.look() is None
        assert (tmp_path / "local" / "metrics.jsonl").read_text() == '{"step": 7}\n'
        assert rm.state(remote, str(work)) == (None, {"step": 7})
        rm.kill(remote, str(work))  # SIGTERM to the process group of the pid
        assert sleeper.wait(timeout=10) == -15
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert watch.look() == 255  # died without an exit status
    (work / "status" / "exit.node0").write_text("3\n")
    assert watch.look() == 3 and rm.state(remote, str(work)) == (3, {"step": 7})


def test_fetch_copies_the_run_back_except_the_pods_plan(tmp_path, pod) -> None:
    remote, work = pod
    (work / "run" / "plan.yaml").write_text("run_dir: /pod/run\n")
    (work / "run" / "checkpoints" / "step2").mkdir(parents=True)
    (work / "run" / "checkpoints" / "step2" / "__0_0.distcp").write_bytes(os.urandom(3 << 20))
    local = tmp_path / "local"
    local.mkdir()
    (local / "plan.yaml").write_text("run_dir: local\n")
    rm.fetch(remote, str(work), local)
    assert (local / "plan.yaml").read_text() == "run_dir: local\n"
    assert (local / "checkpoints/step2/__0_0.distcp").read_bytes() == (
        work / "run/checkpoints/step2/__0_0.distcp"
    ).read_bytes()


def test_ssh_failures_name_the_step_and_the_pod(tmp_path, pod, monkeypatch) -> None:
    remote, work = pod
    monkeypatch.setenv("FAKE_SSH_FAIL", ".")
    start = time.monotonic()
    with pytest.raises(
        Exception,
        match=r"copying the run to the pod on root@203.0.113.7:40001 failed "
        r"\(ssh exit status 255\): ssh: connect to host",
    ):
        rm.ship(remote, str(work), rm.bundle({"a": b"x"}))
    with pytest.raises(Exception, match="copying the run directory back from root@203.0.113.7:40001 failed"):
        rm.fetch(remote, str(work), tmp_path / "local")
    assert time.monotonic() - start < 10
    argv = remote.ssh("true")
    assert argv[:3] == ["ssh", "-p", "40001"] and argv[-2:] == ["root@203.0.113.7", "true"]
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in argv and "BatchMode=yes" in argv


def test_jobs_status_logs_cancel_on_a_running_pod(tmp_path, pod, fake, monkeypatch) -> None:
    """``olmx jobs`` on a run whose olmx train was interrupted: the "training" is a sleeping
    process group standing in for the bootstrap."""
    from typer.testing import CliRunner

    from olmx.cli import app
    from olmx_plugins.infra.runpod.provision import RunPodClient
    from olmx_plugins.infra.runpod.rest import ssh_endpoint
    from olmx_plugins.infra.runpod.spec import PodSpec

    remote, work = pod
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    client = RunPodClient(KEY)
    pod_id = client.create_pod(PodSpec(name="p", gpu_type_id="", image="img", gpu_count=0))["id"]
    ssh = ssh_endpoint(client.get_pod(pod_id))
    plan = plan_for(tmp_path, "infra.gpus_per_node=0", f"infra.workdir={work}", "infra.poll_seconds=0.1")
    plan.save()
    (Path(plan.run_dir) / "launch.json").write_text(
        json.dumps(
            {
                "infra": "runpod",
                # As launched, before RunPod restarted the pod on another port:
                "pods": [{"id": pod_id, "host": "198.51.100.9", "port": 40999, "user": "root"}],
                "cluster_id": None,
                "created": True,
                "workdir": str(work),
                "launch_id": "runpod-abc",
                "known_hosts": str(tmp_path / "kh"),
            }
        )
    )
    (work / "run" / "metrics.jsonl").write_text('{"step": 3, "loss": 5.25}\n')
    (work / "run" / "logs" / "node0.log").write_text("line 1\nline 2\nline 3\n")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (work / "status" / "pid.node0").write_text(str(sleeper.pid))
    run = CliRunner()
    try:
        status = run.invoke(app, ["jobs", "status", plan.run_dir])
        assert status.exit_code == 0, status.output
        assert status.output.splitlines() == [
            f"note: RunPod moved the SSH endpoint (pod {pod_id}: 198.51.100.9:40999 -> {ssh.host}:{ssh.port}); "
            "launch.json updated",
            f"RunPod pod {pod_id}: RUNNING",
            "training: running",
            f"progress: step 3/{plan.run.trainer.max_steps}, loss 5.2500",
        ]
        record = json.loads((Path(plan.run_dir) / "launch.json").read_text())
        assert record["pods"] == [{"id": pod_id, "host": ssh.host, "port": ssh.port, "user": "root"}]
        assert record["known_hosts"] == str(tmp_path / "kh")  # still this launch's file
        logs = run.invoke(app, ["jobs", "logs", plan.run_dir, "-n", "2"])
        assert logs.output.strip() == "line 2\nline 3"
        cancel = run.invoke(app, ["jobs", "cancel", plan.run_dir])
        assert cancel.exit_code == 0, cancel.output
        assert sleeper.wait(timeout=10) == -15  # the training's process group got SIGTERM
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert fake.pods[pod_id]["status"] == "EXITED"  # stopped after the copy back
    assert (Path(plan.run_dir) / "logs" / "node0.log").read_text() == "line 1\nline 2\nline 3\n"
    assert (Path(plan.run_dir) / "metrics.jsonl").read_text() == '{"step": 3, "loss": 5.25}\n'


@pytest.mark.parametrize(("env", "want"), [((), "ens1"), (("+infra.env.NCCL_SOCKET_IFNAME=ib0",), "ib0")])
def test_cluster_nodes_use_the_cluster_interface_unless_told_otherwise(tmp_path, env, want) -> None:
    """The real bootstrap of a 2-node cluster, run here with a Python whose torchrun prints
    the socket interfaces it would use (RunPod documents ens1 as required on clusters)."""
    work = tmp_path / "work"
    (work / "run").mkdir(parents=True)
    python = tmp_path / "pod-python"
    python.write_text(
        '#!/bin/bash\nfor a in "$@"; do [ "$a" = torch.distributed.run ] && '
        '{ echo "torchrun nccl=$NCCL_SOCKET_IFNAME gloo=$GLOO_SOCKET_IFNAME"; exit 0; }; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    over = [*GPU8, "infra.nodes=2", "trainer.global_batch_size=32", "infra.install=false", *env]
    plan = plan_for(tmp_path, *over, "infra.flash_attn_wheel=null", f"infra.workdir={work}", f"infra.python={python}")
    script = work / "bootstrap.sh"
    script.write_text(RUNPOD.bootstrap(plan.infra, plan))
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=work,
        env={
            "PATH": "/usr/bin:/bin",
            "NODE_RANK": "1",
            "NUM_NODES": "2",
            "MASTER_ADDR": "10.0.0.1",
            "OLMX_POD_ENV_FILE": "/dev/null",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    log = (work / "run" / "logs" / "node1.log").read_text()
    assert f"torchrun nccl={want} gloo={'ens1'}" in log, proc.stderr + log


def test_the_bootstrap_runs_torchrun_and_a_sigterm_ends_it_with_status_143(tmp_path, pod) -> None:
    """The real bootstrap on the "pod", with a Python whose torchrun is a long sleep: ship,
    start, watch, ``kill`` (what olmx jobs cancel does), and the exit status it records."""
    remote, work = pod
    python = tmp_path / "pod-python"
    python.write_text(
        f'#!/bin/bash\nfor a in "$@"; do [ "$a" = torch.distributed.run ] && '
        f'{{ echo "torchrun $*"; exec sleep 60; }}; done\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    plan = plan_for(
        tmp_path, "infra.gpus_per_node=0", "infra.install=false", f"infra.workdir={work}", f"infra.python={python}"
    )
    rm.ship(remote, str(work), build_bundle(plan, plan.infra))
    rm.start(remote, str(work))
    watch = rm.Watch(remote, str(work), tmp_path / "local")
    watch.reset()
    deadline = time.monotonic() + 60
    while "torchrun" not in watch.log.read_text():
        assert watch.look() is None and time.monotonic() < deadline
        time.sleep(0.3)
    # The torchrun options every infra target shares (olmx.launch.torchrun_flags).
    assert (
        f"--nnodes=1 --nproc-per-node=2 --max-restarts=0 --log-dir={work}/run/logs/torchrun --tee=3 "
        "--standalone -m olmx run "
    ) in watch.log.read_text()
    rm.kill(remote, str(work))
    while (code := watch.look()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert code == 143
    assert "olmx: bootstrap on node 0 ends with status 143 (stopped by SIGTERM)" in watch.log.read_text()


def test_local_data_files_ship_with_the_run_and_too_much_is_refused_before_any_pod(
    tmp_path,
    fake,
    monkeypatch,
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "b.txt").write_text("second file " * 200)  # enough bytes for one step of 16 x 256 tokens
    (corpus / "a.txt").write_text("first file " * 200)
    plan = plan_for(
        tmp_path,
        "infra.gpus_per_node=0",
        "infra.install=false",
        "infra.workdir=/w",
        "data=text",
        f"data.paths=[{corpus}/*.txt]",
    )
    data = build_bundle(plan, plan.infra)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        pod_plan = tar.extractfile("run/plan.yaml").read().decode()
        shipped = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.startswith("data/")}
    # Outside the pod's run directory, which is what olmx copies back.
    assert shipped == {
        "data/000-a.txt": (corpus / "a.txt").read_bytes(),
        "data/001-b.txt": (corpus / "b.txt").read_bytes(),
    }
    assert "- /w/data/000-a.txt\n    - /w/data/001-b.txt" in pod_plan and str(corpus) not in pod_plan
    assert ", data/ (2 data file(s), 0.0 MB)" in RUNPOD.dry_run(plan.infra, plan)
    # Data already on the pods (image, network volume): paths untouched, nothing shipped.
    kept = plan_for(
        tmp_path,
        "infra.gpus_per_node=0",
        "infra.install=false",
        "data=text",
        "data.paths=[/volume/corpus.txt]",
        "infra.ship_data=false",
    )
    assert not [n for n in _names(build_bundle(kept, kept.infra)) if n.startswith("data/")]

    big = plan_for(
        tmp_path,
        "infra.gpus_per_node=0",
        "data=text",
        f"data.paths=[{corpus}/*.txt]",
        "infra.ship_data_max_gb=0.000001",
    )
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with pytest.raises(ConfigError, match=r"infra.ship_data_max_gb.*0.0 GB.*infra.ship_data=false"):
        RUNPOD.launch(big.infra, big)
    assert not fake.calls("POST", "/v2/pods")


def test_the_bootstrap_ends_with_the_runs_own_code_when_it_stopped_with_a_checkpoint(tmp_path, pod) -> None:
    """torchrun exits 1 when its workers exit 75; the bootstrap reads the run's ``end`` record
    (written by global rank 0 under this launch's id) and ends with 75, as ``olmx train`` does."""
    remote, work = pod
    python = tmp_path / "pod-python"
    record = '{"event": "end", "launch": "%s", "reason": "SIGTERM", "step": 7}'
    python.write_text(
        f'#!/bin/bash\nfor a in "$@"; do [ "$a" = torch.distributed.run ] && '
        f"{{ printf '{record}\\n' \"$OLMX_LAUNCH_ID\" >> events.jsonl; exit 1; }}; done\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    plan = plan_for(
        tmp_path, "infra.gpus_per_node=0", "infra.install=false", f"infra.workdir={work}", f"infra.python={python}"
    )
    rm.ship(remote, str(work), build_bundle(plan, plan.infra, "runpod-test1"))
    rm.start(remote, str(work))
    watch = rm.Watch(remote, str(work), tmp_path / "local")
    watch.reset()
    deadline = time.monotonic() + 60
    while (code := watch.look()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert code == 75
    log = watch.log.read_text()
    assert "stopped: stopped by SIGTERM; checkpoint saved at step 7" in log
    assert "olmx: bootstrap on node 0 ends with status 75" in log


def test_wait_for_ssh_retries_refused_connections_and_gives_up_on_a_refused_key(pod, monkeypatch) -> None:
    remote, _ = pod
    monkeypatch.setenv("FAKE_SSH_REFUSE_FIRST", "2")
    seconds, tries = rm.wait_for_ssh(remote, timeout=30, poll=0.01)
    assert tries == 3 and seconds < 30
    monkeypatch.setenv("FAKE_SSH_REFUSE_FIRST", "1000")
    start = time.monotonic()
    with pytest.raises(Exception, match=r"did not answer within 0.5 s \(\d+ tries; infra.ssh_wait_timeout\)"):
        rm.wait_for_ssh(remote, timeout=0.5, poll=0.1)
    assert time.monotonic() - start < 5
    monkeypatch.delenv("FAKE_SSH_REFUSE_FIRST")
    monkeypatch.setenv("FAKE_SSH_DENY", "1")
    with pytest.raises(Exception, match=r"refused the SSH key 3 times.*Permission denied \(publickey\)"):
        rm.wait_for_ssh(remote, timeout=300, poll=0.01)
