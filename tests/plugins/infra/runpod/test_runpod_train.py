"""``olmx train infra=runpod`` end to end against the fake RunPod API, with a stand-in ``ssh``
that runs the "pod's" commands on this machine (fake_ssh.py).

Everything olmx does is real except the network hop: the create request and the polling over
HTTP, the tar that ships plan + bootstrap + olmx source, the rendered bootstrap running under
bash (image check, pinned install, torchrun, ``olmx run``), the watcher mirroring metrics and
log, the copy back, the stop request. The pod is a CPU pod (``infra.gpus_per_node=0``), so
the training really runs here. The "pod's" Python is a wrapper around this Python that fakes
only ``pip install`` (no network here) and records its arguments.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from fake_runpod import SSH_HOST
from runpod_testing import KEY, ssh_calls

from tests.conftest import olmx_cli
from tests.test_training import SMALL

pytestmark = pytest.mark.dist
SECRET = "s3cr3t-value-that-must-stay-on-the-pod"


def pod_python(tmp_path: Path, *, fail: bool = False) -> Path:
    """The pod's ``python``: records ``-m pip`` calls (and fakes them); otherwise this Python."""
    path = tmp_path / "pod-python"
    body = (
        "echo 'olmx-test: the image has no working python' >&2; exit 3"
        if fail
        else f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$@" >> {tmp_path}/pip.args; exit 0; fi\n'
        f'exec {sys.executable} "$@"'
    )
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def runpod_args(tmp_path: Path, python: Path, key: Path) -> list[str]:
    """A CPU pod whose "image" Python is ``python``, reached with the SSH key ``key``."""
    return [
        "infra=runpod",
        f"infra.ssh_key={key}",
        "infra.gpus_per_node=0",
        "infra.nproc_per_node=1",
        "parallel=[]",
        f"infra.workdir={tmp_path / 'pod'}",
        f"infra.python={python}",
        "infra.poll_seconds=2",
        "infra.wait_timeout=30",
        "infra.pass_env=[OLMX_TEST_SECRET]",
        *SMALL,
        f"trainer.run_dir={tmp_path / 'run'}",
    ]


@pytest.fixture
def env(fake, fake_ssh, tmp_path_factory) -> dict[str, str]:
    return {
        **fake_ssh,
        "RUNPOD_API_BASE_URL": fake.base_url,
        "RUNPOD_API_KEY": KEY,
        "OLMX_TEST_SECRET": SECRET,
        "OLMX_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "olmx-cache"),
    }


def files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file())


def test_train_on_a_cpu_pod_end_to_end(tmp_path: Path, fake, env, ssh_identity) -> None:
    run, pod_dir = tmp_path / "run", tmp_path / "pod"
    proc = olmx_cli(
        "train",
        *runpod_args(tmp_path, pod_python(tmp_path), ssh_identity),
        "trainer.max_steps=3",
        "trainer.save_interval=2",
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out + (files_text(run / "logs") if (run / "logs").exists() else "")

    # RunPod: one CPU pod created with the secret in its env, polled until RUNNING, stopped at the end.
    (create,) = fake.calls("POST", "/v2/pods")
    assert create.body["cpu"] == {"id": "cpu3c", "vcpuCount": 4} and "gpu" not in create.body
    assert create.body["env"] == {"OLMX_TEST_SECRET": SECRET} and create.body["disk"] == 100
    (pod_id,) = fake.pods
    assert [c.body for c in fake.calls("POST", rf"/v2/pods/{pod_id}/action")] == [{"action": "stop"}]
    assert fake.pods[pod_id]["status"] == "EXITED"
    assert not fake.calls("DELETE", r"/v2/pods/.*")

    # SSH: ship, start, watch ..., copy back; every call to the pod's published endpoint.
    calls = ssh_calls(env)
    record = json.loads((run / "launch.json").read_text())
    port = record["pods"][0]["port"]
    assert {(c["port"], c["destination"]) for c in calls} == {(port, f"root@{SSH_HOST}")}
    assert record["known_hosts"] == f"{run}/.ssh/known_hosts-{record['launch_id']}"
    assert all(f"-o UserKnownHostsFile={record['known_hosts']}" in c["options"] for c in calls)
    assert all(f"-i {ssh_identity}" in c["options"] for c in calls)
    commands = [c["command"] for c in calls]
    assert commands[0] == "true"  # sshd answers before anything is shipped
    assert "tar -xzf - -C" in commands[1] and "NODE_RANK=0 NUM_NODES=1 nohup setsid bash bootstrap.sh" in commands[2]
    assert "tar -cf - --exclude=./plan.yaml ." in commands[-1]
    assert len(commands) >= 4  # at least one look while training

    # The pod ran the bootstrap: pinned install from the shipped source, torch held at the image's.
    pip = (tmp_path / "pip.args").read_text()
    assert f"--constraint {pod_dir}/constraints.txt {pod_dir}/olmx-src" in pip
    pins = (pod_dir / "constraints.txt").read_text().splitlines()
    assert "ai2-olmo-core==3.0.0" in pins and pins[-1].startswith("torch==2.13.0")
    assert (pod_dir / "olmx-src" / "olmx" / "cli.py").is_file()
    assert "run_dir: " + str(pod_dir / "run") in (pod_dir / "run" / "plan.yaml").read_text()

    # Locally: the run directory came back (metrics, checkpoints, logs), summary names it.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] < records[0]["loss"]
    for step in (2, 3):
        assert (run / "checkpoints" / f"step{step}" / ".metadata.json").is_file()
    assert json.loads((run / "summary.json").read_text())["run_dir"] == str(run)
    log = (run / "logs" / "node0.log").read_text()
    assert "olmx: node 0 of 1" in log and "olmx: bootstrap on node 0 ends with status 0" in log
    assert record["pods"] == [{"id": pod_id, "host": SSH_HOST, "port": port, "user": "root"}]
    assert f"Stopped RunPod pod {pod_id}" in out

    # The API key and the passed secret appear nowhere: output, run directory, pod directory.
    for text in (out, files_text(run), files_text(pod_dir)):
        assert KEY not in text and SECRET not in text


def test_a_failing_run_ends_with_its_exit_code_and_log_and_the_pod_is_stopped(
    tmp_path: Path, fake, env, ssh_identity
) -> None:
    proc = olmx_cli("train", *runpod_args(tmp_path, pod_python(tmp_path, fail=True), ssh_identity), env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "training failed with exit code 3" in proc.stderr
    assert "olmx-test: the image has no working python" in proc.stderr  # the log tail
    (pod_id,) = fake.pods
    assert fake.pods[pod_id]["status"] == "EXITED"  # copied back, then stopped
    assert "olmx-test: the image has no working python" in (tmp_path / "run" / "logs" / "node0.log").read_text()


def test_a_pod_that_cannot_be_reached_is_terminated(tmp_path: Path, fake, env, ssh_identity) -> None:
    proc = olmx_cli(
        "train", *runpod_args(tmp_path, pod_python(tmp_path), ssh_identity), env={**env, "FAKE_SSH_FAIL": "tar -xzf"}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "copying the run to the pod" in proc.stderr and "Connection refused" in proc.stderr
    assert "which olmx had created: nothing is left running" in proc.stderr
    assert fake.pods == {} and len(fake.calls("DELETE", r"/v2/pods/.*")) == 1


def test_a_cluster_is_shipped_to_every_node_and_terminated_when_starting_fails(
    tmp_path: Path, fake, env, ssh_identity
) -> None:
    args = [
        "infra=runpod",
        "infra.nodes=2",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=1",
        f"infra.workdir={tmp_path / 'pod'}",
        f"infra.ssh_key={ssh_identity}",
        "infra.poll_seconds=0.05",
        f"trainer.run_dir={tmp_path / 'run'}",
    ]
    proc = olmx_cli("train", *args, env={**env, "FAKE_SSH_FAIL": "NODE_RANK=1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (create,) = fake.calls("POST", "/v2/clusters")  # 8 GPUs per node: the default for clusters
    assert create.body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 8, "podCount": 2}
    record = json.loads((tmp_path / "run" / "launch.json").read_text())
    ports = [p["port"] for p in record["pods"]]  # node 0 first
    calls = [(c["port"], c["command"]) for c in ssh_calls(env) if c["command"] != "true"]
    assert [c["port"] for c in ssh_calls(env)][:2] == ports  # sshd of every node answered first
    assert [port for port, _ in calls] == [ports[0], ports[1], ports[0], ports[1]]  # ship, ship, start, start
    assert all("tar -xzf - -C" in command for _, command in calls[:2])
    assert "NODE_RANK=0 NUM_NODES=2 nohup" in calls[2][1] and "NODE_RANK=1 NUM_NODES=2 nohup" in calls[3][1]
    assert "starting the bootstrap" in proc.stderr
    assert fake.clusters == {} and fake.pods == {}  # the cluster olmx made is gone
    assert "--rdzv-backend=c10d" in (tmp_path / "pod" / "bootstrap.sh").read_text()


def test_a_pod_running_before_its_ssh_port_and_sshd_is_waited_for(tmp_path: Path, fake, env, ssh_identity) -> None:
    fake.ssh_after_polls = 2  # RUNNING, but no public port for 22/tcp for two more looks
    args = [a for a in runpod_args(tmp_path, pod_python(tmp_path), ssh_identity) if "poll_seconds" not in a]
    # sshd refuses the first two connections; the copy then fails, which ends the launch early.
    proc = olmx_cli(
        "train",
        *args,
        "infra.poll_seconds=0.05",
        env={**env, "FAKE_SSH_REFUSE_FIRST": "2", "FAKE_SSH_FAIL": "tar -xzf"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(fake.calls("POST", "/v2/pods")) == 1
    (pod_id,) = [c.path.rsplit("/", 1)[1] for c in fake.calls("DELETE", r"/v2/pods/.*")]  # terminated
    assert len(fake.calls("GET", rf"/v2/pods/{pod_id}")) == 3  # STARTING->RUNNING, RUNNING without port, with port
    assert [c["command"] for c in ssh_calls(env)][:3] == ["true", "true", "true"]
    assert re.search(rf"SSH on pod {pod_id} \(root@{SSH_HOST}:\d+\) answered after [\d.]+ s \(3 tries\)", proc.stderr)
    assert "copying the run to the pod" in proc.stderr and fake.pods == {}


def test_an_account_without_ssh_keys_is_refused_before_anything_is_written(
    tmp_path: Path, fake, env, ssh_identity
) -> None:
    fake.ssh_keys = []
    proc = olmx_cli("train", *runpod_args(tmp_path, pod_python(tmp_path), ssh_identity), env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: infra.ssh_key: the RunPod account has no registered SSH public key" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and fake.calls("POST", "/v2/pods") == []
