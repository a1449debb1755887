"""``olmx provision runpod ...`` through the real CLI (in process) against the fake RunPod API."""

from __future__ import annotations

import json

import pytest
from fake_runpod import SSH_HOST
from runpod_testing import KEY, fake  # noqa: F401  (fixture)
from typer.testing import CliRunner

from olmx.cli import app

GPU8 = ["infra.gpus_per_node=8", "trainer.global_batch_size=16", "trainer.micro_batch_size=1"]


@pytest.fixture
def olmx(fake, monkeypatch, tmp_path):  # noqa: F811
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


def test_provision_a_pod_then_manage_it(olmx, fake) -> None:  # noqa: F811
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


def test_provision_an_instant_cluster(olmx, fake) -> None:  # noqa: F811
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


def test_dry_run_sends_nothing(olmx, fake, monkeypatch) -> None:  # noqa: F811
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


def test_errors_are_one_clean_line(olmx, fake, monkeypatch) -> None:  # noqa: F811
    assert "infra.nodes: must be between 2 and 250" in olmx(*GPU8, "infra.nodes=300", code=2)
    assert "provisions infra=runpod, not infra=local" in olmx("infra=local", code=2)
    monkeypatch.delenv("RUNPOD_API_KEY")
    monkeypatch.setenv("HOME", "/nonexistent")
    assert "no RunPod API key: set RUNPOD_API_KEY" in olmx("list", code=1)
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONGKEY")
    assert "RunPod rejected the API key from RUNPOD_API_KEY (HTTP 401" in olmx("list", code=1)
    assert fake.pods == {}
