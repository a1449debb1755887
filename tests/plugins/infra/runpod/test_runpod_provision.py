"""``olmx provision runpod ...`` through the real CLI (in process) against the fake RunPod API."""

from __future__ import annotations

import json

import pytest
from fake_runpod import SSH_HOST
from runpod_testing import KEY
from typer.testing import CliRunner

from olmx.cli import app

GPU8 = ["infra.gpus_per_node=8", "trainer.global_batch_size=16", "trainer.micro_batch_size=1"]


@pytest.fixture
def olmx(fake, monkeypatch, tmp_path, ssh_identity):
    monkeypatch.setenv("HOME", str(ssh_identity.parent.parent))  # ~/.ssh/id_ed25519: registered with the fake
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, ["provision", "runpod", *args])
        text = result.output
        assert result.exit_code == code, text + repr(result.exception)
        assert KEY not in text
        return text

    return invoke


def test_provision_a_pod_then_manage_it(olmx, fake) -> None:
    text = olmx(*GPU8, "infra.pod_name=olmx-a", "infra.poll_seconds=0.01")
    (pod_id,) = fake.pods
    (create,) = fake.calls("POST", "/v2/pods")
    assert create.body["name"] == "olmx-a" and create.body["gpu"]["count"] == 8 and create.body["disk"] == 100
    assert "mounts" not in create.body  # no network volume by default
    port = fake.pods[pod_id]["ssh"]["direct"]["port"]
    assert f"RunPod pod {pod_id} (olmx-a) is running." in text
    assert f"Reach it:     ssh -p {port} root@{SSH_HOST}" in text
    assert f"olmx train {' '.join(GPU8)} infra.pod_name=olmx-a infra.poll_seconds=0.01 infra.pod_id={pod_id}" in text

    listing = olmx("list")
    assert pod_id in listing and "RUNNING" in listing and "8 x NVIDIA H100 80GB HBM3" in listing
    status = olmx("status", pod_id)
    assert "status   RUNNING" in status and f"ssh      ssh -p {port} root@{SSH_HOST}" in status
    assert olmx("stop", pod_id).strip() == f"pod {pod_id}: EXITED"
    assert fake.pods[pod_id]["status"] == "EXITED"
    assert olmx("start", pod_id).strip() == f"pod {pod_id}: PROVISIONING"
    assert olmx("terminate", pod_id).strip() == f"pod {pod_id}: terminated"
    assert fake.pods == {}
    missing = olmx("status", pod_id, code=1)
    assert f"RunPod has no pod '{pod_id}'" in missing


def test_provision_an_instant_cluster(olmx, fake) -> None:
    text = olmx(
        *GPU8, "trainer.global_batch_size=32", "infra.nodes=2", "infra.poll_seconds=0.01", "trainer.run_dir=runs/c1"
    )
    (create,) = fake.calls("POST", "/v2/clusters")
    assert create.body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 8, "podCount": 2}
    assert create.body["name"] == "olmx-c1" and create.body["type"] == "TRAINING"
    (cluster_id,) = fake.clusters
    assert f"RunPod cluster {cluster_id} (olmx-c1) is running:" in text
    assert "  node 0: pod " in text and "  node 1: pod " in text
    assert f"infra.cluster_id={cluster_id}" in text
    assert "olmx-c1" in olmx("list")
    assert olmx("terminate-cluster", cluster_id).strip() == f"cluster {cluster_id}: terminated"
    assert fake.clusters == {} and fake.pods == {}


def test_dry_run_sends_nothing(olmx, fake, monkeypatch) -> None:
    monkeypatch.setenv("OLMX_T", "passed-value")
    text = olmx("--dry-run", "infra.gpus_per_node=0", "infra.pass_env=[OLMX_T]")
    head, _, body = text.partition("\n\n")
    assert head.splitlines() == [
        f"POST {fake.base_url}/v2/pods",
        "Authorization: Bearer <redacted>",
        "Content-Type: application/json",
    ]
    assert json.loads(body)["cpu"] == {"id": "cpu3c", "vcpuCount": 4}
    assert "passed-value" not in text and fake.requests == []


def test_errors_are_one_clean_line(olmx, fake, monkeypatch) -> None:
    assert "infra.nodes: must be between 2 and 250" in olmx(*GPU8, "infra.nodes=300", code=2)
    assert "provisions infra=runpod, not infra=local" in olmx("infra=local", code=2)
    monkeypatch.delenv("RUNPOD_API_KEY")
    monkeypatch.setenv("HOME", "/nonexistent")
    assert "no RunPod API key: set RUNPOD_API_KEY" in olmx("list", code=1)
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONGKEY")
    assert "RunPod rejected the API key from RUNPOD_API_KEY (HTTP 401" in olmx("list", code=1)
    assert fake.pods == {}


def test_no_capacity_moves_on_to_the_next_gpu_type_and_data_centre(olmx, fake) -> None:
    fake.no_capacity = {"NVIDIA H100 80GB HBM3", "NVIDIA H200@US-TX-3"}
    text = olmx(
        *GPU8,
        "infra.gpu_types=[NVIDIA H200]",
        "infra.data_centers=[US-TX-3,EU-RO-1]",
        "infra.poll_seconds=0.01",
    )
    tried = [(c.body["gpu"]["id"], c.body["dataCenterIds"]) for c in fake.calls("POST", "/v2/pods")]
    assert tried == [
        ("NVIDIA H100 80GB HBM3", ["US-TX-3"]),
        ("NVIDIA H100 80GB HBM3", ["EU-RO-1"]),
        ("NVIDIA H200", ["US-TX-3"]),
        ("NVIDIA H200", ["EU-RO-1"]),
    ]
    (pod_id,) = fake.pods
    assert fake.pods[pod_id]["gpu"]["id"] == "NVIDIA H200"
    assert "RunPod has no 8 x NVIDIA H100 80GB HBM3 in US-TX-3 now (There are no longer any instances" in text
    assert text.count("trying the next") == 3 and f"RunPod pod {pod_id}" in text


def test_when_every_candidate_is_refused_each_try_is_listed(olmx, fake) -> None:
    fake.no_capacity = {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    text = " ".join(olmx(*GPU8, "infra.gpu_types=[NVIDIA H200]", code=1).split())
    assert "RunPod created none of the 2 candidates:" in text
    assert "8 x NVIDIA H100 80GB HBM3 in any data centre: HTTP 400, There are no longer any instances" in text
    assert "8 x NVIDIA H200 in any data centre: HTTP 400" in text and "infra.gpu_types" in text
    assert fake.pods == {}
    fake.no_capacity = {"NVIDIA H100 80GB HBM3"}  # a single candidate: RunPod's own message
    assert "RunPod refused POST /v2/pods (HTTP 400" in " ".join(olmx(*GPU8, code=1).split())


def test_an_account_without_a_usable_ssh_key_is_refused_before_any_pod(olmx, fake, tmp_path, monkeypatch) -> None:
    fake.ssh_keys = []
    text = " ".join(olmx(*GPU8, code=2).split())
    assert "infra.ssh_key: the RunPod account has no registered SSH public key" in text
    assert "olmx provision runpod ssh-keys add" in text and "id_ed25519.pub" in text
    fake.ssh_keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOtherKeyOtherKey1 other@host"]
    text = " ".join(olmx(*GPU8, code=2).split())
    assert "none of the SSH keys here" in text and "(1 other key(s) are)" in text
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    assert "this machine has no SSH key to reach the pods with" in " ".join(olmx(*GPU8, code=2).split())
    assert fake.calls("POST", "/v2/pods") == []


def test_ssh_keys_lists_and_adds_the_accounts_keys(olmx, fake, ssh_identity) -> None:
    public = f"{ssh_identity}.pub"
    assert "olmx-test   (here: " in olmx("ssh-keys")
    fake.ssh_keys = []
    assert "No SSH public key is registered" in olmx("ssh-keys")
    assert "Registered" in olmx("ssh-keys", "add", public) and len(fake.ssh_keys) == 1
    assert "is already registered (1 key(s) in all)" in olmx("ssh-keys", "add", public)
    (put,) = fake.calls("PUT", "/v2/account/ssh-keys")
    assert put.body == {"keys": [open(public).read().strip()]}
    assert "that is a private key: give its .pub file" in olmx("ssh-keys", "add", str(ssh_identity), code=2)
