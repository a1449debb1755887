"""olmx's RunPod client against a fake RunPod REST v2 server over real HTTP on 127.0.0.1.

Every failure raised here is checked for the API key: in its message, its repr and its
traceback rendered with the locals of every frame; every test also checks the captured log.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import logging
import pickle
import threading
import time
import traceback
from collections.abc import Iterator

import pytest
from fake_runpod import SSH_HOST, FakeRunPod, Fault

from olmx.errors import ConfigError, LaunchError
from olmx_plugins.infra.runpod.errors import (
    RunPodAuthError,
    RunPodError,
    RunPodNotFoundError,
    RunPodOrphanError,
    RunPodPodFailedError,
    RunPodRequestError,
    RunPodUnavailableError,
    RunPodWaitTimeout,
)
from olmx_plugins.infra.runpod.provision import ReadyCluster, ReadyPod, RunPodClient
from olmx_plugins.infra.runpod.rest import SshEndpoint
from olmx_plugins.infra.runpod.spec import (
    CloudType,
    ClusterSpec,
    PodSpec,
    build_cluster_request,
    build_pod_request,
)
from olmx_plugins.infra.runpod.transport import RetryPolicy, redacted_request, resolve_base_url

KEY = "rpa_Q3T9XK2LM8PZ7W4VB6NJ5HC1DF0GSY2E8RU"
FORBIDDEN_KEY = "rpa_READONLYREADONLYREADONLYREADONLY00"
FAST = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, total_time=3.0)
H100 = "NVIDIA H100 80GB HBM3"
IMAGE = "ghcr.io/example/olmx:torch2.13-cu128"
POD_PATH = r"/v2/pods/[^/]+"


def pod_spec(**changes) -> PodSpec:
    fields = dict(name="olmx-test", gpu_type_id=H100, image=IMAGE, gpu_count=8, env={"WANDB_MODE": "offline"})
    return PodSpec(**{**fields, **changes})


def assert_no_key(exc: BaseException) -> None:
    """The key appears in no message, repr, note or frame local of ``exc`` and its chain."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # the tests' own frames hold the key on purpose
    assert tb is not None
    rendered = "".join(traceback.TracebackException(type(exc), exc, tb, capture_locals=True).format())
    for text in (str(exc), repr(exc), rendered):
        assert KEY not in text


@contextlib.contextmanager
def raises_clean(exc_type: type[BaseException], match: str | None = None) -> Iterator[pytest.ExceptionInfo]:
    with pytest.raises(exc_type, match=match) as info:
        yield info
    assert_no_key(info.value)


@pytest.fixture
def fake() -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY, forbidden_key=FORBIDDEN_KEY) as server:
        yield server


@pytest.fixture
def client(fake, monkeypatch, caplog) -> Iterator[RunPodClient]:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    caplog.set_level(logging.DEBUG)
    yield RunPodClient(KEY, timeout=0.5, retry=FAST)
    assert KEY not in caplog.text


# ------------------------------------------------------------------------------- spec


def test_pod_request_body_is_exactly_the_v2_shape() -> None:
    spec = pod_spec(ports=("8888/http",), data_center_ids=("US-TX-3",), network_volume_id="vol_9", args="--x")
    assert build_pod_request(spec) == {
        "name": "olmx-test",
        "image": IMAGE,
        "gpu": {"id": H100, "count": 8},
        "cloud": "SECURE",
        "disk": 100,
        "ports": ["22/tcp", "8888/http"],
        "env": {"WANDB_MODE": "offline"},
        "startSsh": True,
        "args": "--x",
        "dataCenterIds": ["US-TX-3"],
        "mounts": {"network": [{"volumeId": "vol_9", "path": "/runpod-volume"}]},
    }


def test_pod_request_defaults_container_disk_no_volume_ssh_port() -> None:
    body = build_pod_request(PodSpec(name="a", gpu_type_id=H100, image=IMAGE, cloud_type=CloudType.COMMUNITY))
    assert body == {
        "name": "a",
        "image": IMAGE,
        "gpu": {"id": H100, "count": 1},
        "cloud": "COMMUNITY",
        "disk": 100,
        "ports": ["22/tcp"],
        "env": {},
        "startSsh": True,
    }


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": " "}, "name"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu_count": 0, "vcpu_count": 0}, "vcpu_count"),
        ({"min_cuda_version": "13"}, "min_cuda_version"),
        ({"container_disk_gb": 0}, "container_disk_gb"),
        ({"ports": ("22",)}, "ports"),
        ({"ports": ("8888/udp",)}, "ports"),  # RunPod pods have no UDP
        ({"gpu_count": 0, "vcpu_count": 3}, "vcpu_count"),  # a power of two, at least 2
        ({"env": {f"V{i}": "1" for i in range(51)}}, "env"),  # at most 50
        ({"env": {"BAD-NAME": "x"}}, "env"),
        ({"env": {"N": 3}}, "env"),
        ({"network_volume_id": "v", "network_volume_path": "rel"}, "network_volume_path"),
    ],
)
def test_pod_spec_validation_names_the_field(changes, field) -> None:
    with pytest.raises(ConfigError) as info:
        build_pod_request(pod_spec(**changes))
    assert info.value.field == field


def test_cluster_request_body_and_limits() -> None:
    spec = ClusterSpec(name="c", gpu_type_id=H100, image=IMAGE, pod_count=4, env={"A": "1"})
    assert build_cluster_request(spec) == {
        "name": "c",
        "type": "TRAINING",
        "compute": {"gpuTypeId": H100, "gpuCountPerPod": 8, "podCount": 4},
        "image": IMAGE,
        "disk": 100,
        "ports": ["22/tcp"],
        "env": {"A": "1"},
        "startSsh": True,
    }
    for count in (1, 251):
        with pytest.raises(ConfigError, match="between 2 and 250"):
            build_cluster_request(ClusterSpec(name="c", gpu_type_id=H100, image=IMAGE, pod_count=count))


# ------------------------------------------------------------------------------- happy path


def test_provision_lifecycle(client, fake) -> None:
    spec = pod_spec()
    ready = client.provision(spec, timeout=5, poll=0.01)

    assert isinstance(ready, ReadyPod)
    assert ready.ssh.host == SSH_HOST and ready.ssh.port > 40000 and ready.ssh.username == "root"
    assert ready.ssh.command() == ["ssh", "-p", str(ready.ssh.port), f"root@{SSH_HOST}"]
    assert ready.pod["status"] == "RUNNING" and ready.name == "olmx-test"
    (post,) = fake.calls("POST", "/v2/pods")
    assert post.body == build_pod_request(spec)
    assert {r.authorization for r in fake.requests} == {f"Bearer {KEY}"}
    assert len(fake.calls("GET", POD_PATH)) == 2  # PROVISIONING -> STARTING -> RUNNING

    assert [p["id"] for p in client.list_pods()] == [ready.id]
    assert client.list_pods(name="other") == []
    assert client.stop_pod(ready.id)["status"] == "EXITED"
    assert client.stop_pod(ready.id)["status"] == "EXITED"  # stopping a stopped pod is fine
    assert client.start_pod(ready.id)["status"] == "PROVISIONING"
    assert client.start_pod(ready.id)["status"] in {"STARTING", "RUNNING"}
    client.terminate_pod(ready.id)
    assert fake.pods == {}
    with raises_clean(RunPodNotFoundError, match=ready.id):
        client.get_pod(ready.id)


def test_wait_fails_fast_when_the_pod_stops(client, fake) -> None:
    pod = client.create_pod(pod_spec())
    client.stop_pod(pod["id"])
    with raises_clean(RunPodPodFailedError, match=f"pod {pod['id']} is EXITED"):
        client.wait_until_running(pod["id"], timeout=5, poll=0.01)


def test_list_follows_pagination(client, fake) -> None:
    ids = [client.create_pod(pod_spec(name=f"p{i}"))["id"] for i in range(5)]
    fake.page_size = 2
    first = len(fake.requests)
    assert [p["id"] for p in client.list_pods()] == ids
    cursors = [r.query.get("cursor") for r in fake.requests[first:]]
    assert cursors == [None, ["2"], ["4"]]
    fake.page_size = None
    first = len(fake.requests)
    assert len(client.list_pods()) == 5 and len(fake.requests) == first + 1


def test_cluster_provision_and_terminate(client, fake) -> None:
    spec = ClusterSpec(name="olmx-c", gpu_type_id=H100, image=IMAGE, pod_count=3, gpus_per_pod=8)
    ready = client.provision(spec, timeout=5, poll=0.01)

    assert isinstance(ready, ReadyCluster)
    (post,) = fake.calls("POST", "/v2/clusters")
    assert post.body == build_cluster_request(spec)
    assert [node.pod["cluster"]["rank"] for node in ready.nodes] == [0, 1, 2]
    assert all(node.ssh.host == SSH_HOST for node in ready.nodes)
    assert client.get_cluster(ready.id)["primary"]["podId"] == ready.nodes[0].id
    assert client.list_pods() == []  # members are not standalone pods
    assert len(client.list_pods(include_cluster_pods=True)) == 3
    client.terminate_cluster(ready.id)
    assert fake.clusters == {} and fake.pods == {}


def test_stuck_cluster_is_terminated(client, fake) -> None:
    fake.stuck = True
    with raises_clean(RunPodWaitTimeout, match="cluster"):
        client.provision(ClusterSpec(name="c", gpu_type_id=H100, image=IMAGE), timeout=0.1, poll=0.01)
    assert fake.clusters == {} and fake.pods == {}


# ------------------------------------------------------------------------------- clear errors


def test_validation_errors_show_the_server_message(client, fake) -> None:
    body = {**build_pod_request(pod_spec()), "bogus": 1}
    with raises_clean(RunPodRequestError, match="additional properties 'bogus' not allowed") as info:
        client.create_pod(body)
    assert info.value.status == 422
    with raises_clean(RunPodRequestError, match="exactly one of gpu or cpu") as info:
        client.create_pod({**build_pod_request(pod_spec()), "cpu": {"id": "cpu3c", "vcpuCount": 4}})
    assert info.value.status == 400
    assert fake.pods == {}


def test_invalid_and_forbidden_keys(fake, monkeypatch) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    wrong = RunPodClient("rpa_WRONGWRONGWRONG", retry=FAST)
    with pytest.raises(RunPodAuthError, match="HTTP 401") as info:
        wrong.list_pods()
    assert "WRONGWRONG" not in str(info.value) and "invalid" in str(info.value)
    with pytest.raises(RunPodAuthError, match="may not GET /v2/pods") as info:
        RunPodClient(FORBIDDEN_KEY, retry=FAST).list_pods()
    assert "READONLY" not in str(info.value) and "HTTP 403" in str(info.value)
    assert isinstance(info.value, LaunchError)
    assert len(fake.requests) == 2  # auth failures are not retried


def test_key_from_env_or_file(fake, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    missing = tmp_path / "none"
    with raises_clean(RunPodAuthError, match=f"RUNPOD_API_KEY or write the key to {missing}"):
        RunPodClient.from_env(key_file=missing)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert RunPodClient.from_env(key_file=key_file, retry=FAST).list_pods() == []
    key_file.write_text("rpa_STALE")
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)  # the environment wins over the file
    assert RunPodClient.from_env(key_file=key_file, retry=FAST).list_pods() == []
    monkeypatch.delenv("RUNPOD_API_KEY")
    with raises_clean(RunPodAuthError, match=f"key from {key_file}"):
        RunPodClient.from_env(key_file=key_file, retry=FAST).list_pods()


def test_base_url_rules(monkeypatch) -> None:
    monkeypatch.delenv("RUNPOD_API_BASE_URL", raising=False)
    assert resolve_base_url() == "https://api.runpod.io"
    assert resolve_base_url("https://api.runpod.io/v2/") == "https://api.runpod.io"
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9")
    assert resolve_base_url() == "http://127.0.0.1:9"
    with pytest.raises(RunPodError, match="https://"):
        resolve_base_url("http://api.example.com")


# ------------------------------------------------------------------------------- retries


def test_429_burst_with_retry_after_zero_then_success(client, fake) -> None:
    pod = client.create_pod(pod_spec())
    fake.inject("GET", POD_PATH, Fault(429, retry_after="0"), times=3)
    assert client.get_pod(pod["id"])["id"] == pod["id"]
    assert len(fake.calls("GET", POD_PATH)) == 4


def test_retry_after_is_honoured(client, fake) -> None:
    fake.inject("GET", "/v2/pods", Fault(429, retry_after="1"))
    start = time.monotonic()
    assert client.list_pods() == []
    assert 1.0 <= time.monotonic() - start < 2.5  # backoff alone would be 0.01 s


def test_retry_after_beyond_budget_fails_at_once(client, fake) -> None:
    fake.inject("GET", "/v2/pods", Fault(429, retry_after="60"))
    start = time.monotonic()
    with raises_clean(RunPodUnavailableError, match="asked to wait 60 s"):
        client.list_pods()
    assert time.monotonic() - start < 0.5
    assert len(fake.requests) == 1


def test_500s_are_retried_then_reported(client, fake) -> None:
    fake.inject("GET", "/v2/pods", Fault(500), times=2)
    assert client.list_pods() == []
    assert len(fake.requests) == 3
    fake.inject("GET", "/v2/pods", Fault(503), times=float("inf"))
    with raises_clean(RunPodUnavailableError, match=r"HTTP 503 after 4 attempt\(s\)"):
        client.list_pods()
    assert len(fake.requests) == 3 + FAST.max_attempts


def test_timeouts_are_retried_and_bounded(fake, monkeypatch, caplog) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    caplog.set_level(logging.DEBUG)
    policy = RetryPolicy(max_attempts=50, base_delay=0.01, max_delay=0.02, total_time=0.5)
    client = RunPodClient(KEY, timeout=0.1, retry=policy)
    fake.inject("GET", "/v2/pods", Fault(None, delay=0.4))
    assert client.list_pods() == []
    fake.inject("GET", "/v2/pods", Fault(None, delay=0.4), times=float("inf"))
    start = time.monotonic()
    with raises_clean(RunPodUnavailableError, match="imed out"):
        client.list_pods()
    assert time.monotonic() - start < 0.5 + 0.15  # the total budget, not 50 attempts
    assert KEY not in caplog.text


# ------------------------------------------------------------------------------- no orphans


def test_create_answered_500_after_it_succeeded_is_adopted(client, fake) -> None:
    fake.inject("POST", "/v2/pods", Fault(500, commit=True))
    pod = client.create_pod(pod_spec())
    assert list(fake.pods) == [pod["id"]]
    assert len(fake.calls("POST", "/v2/pods")) == 1  # not created twice


def test_create_that_timed_out_after_it_succeeded_is_adopted(fake, monkeypatch) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    client = RunPodClient(KEY, timeout=0.1, retry=FAST)
    fake.inject("POST", "/v2/pods", Fault(None, delay=0.4, commit=True))
    pod = client.create_pod(pod_spec())
    assert list(fake.pods) == [pod["id"]] and len(fake.calls("POST", "/v2/pods")) == 1


def test_create_refused_with_500_is_retried_once_created(client, fake) -> None:
    fake.inject("POST", "/v2/pods", Fault(500))
    pod = client.create_pod(pod_spec())
    assert list(fake.pods) == [pod["id"]] and len(fake.calls("POST", "/v2/pods")) == 2


def test_late_duplicate_of_a_retried_create_is_terminated(fake, monkeypatch) -> None:
    # The first POST times out and RunPod creates that pod only later; the retry creates a
    # second one. The late first one must not be left behind.
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    client = RunPodClient(KEY, timeout=0.1, retry=RetryPolicy(max_attempts=3, base_delay=0.6, total_time=5))
    fake.inject("POST", "/v2/pods", Fault(None, delay=0.3))
    pod = client.create_pod(pod_spec())
    assert list(fake.pods) == [pod["id"]]
    assert len(fake.calls("POST", "/v2/pods")) == 2 and len(fake.calls("DELETE", POD_PATH)) == 1


def test_failed_create_removes_a_pod_that_appeared_late(fake, monkeypatch) -> None:
    # Attempt 1 times out (RunPod creates the pod 0.5 s later), attempt 2 is rate limited,
    # attempt 3 is refused: the create fails, and the late pod must not be left behind.
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.base_url)
    policy = RetryPolicy(max_attempts=3, base_delay=0.25, max_delay=1, total_time=5)
    client = RunPodClient(KEY, timeout=0.1, retry=policy)
    fake.inject("POST", "/v2/pods", Fault(None, delay=0.5))
    fake.inject("POST", "/v2/pods", Fault(429, retry_after="0"))
    fake.inject("POST", "/v2/pods", Fault(400))
    with raises_clean(RunPodRequestError, match="HTTP 400"):
        client.create_pod(pod_spec())
    assert fake.pods == {} and len(fake.calls("DELETE", POD_PATH)) == 1


def test_pod_stuck_in_provisioning_is_terminated(client, fake) -> None:
    fake.stuck = True
    with raises_clean(RunPodWaitTimeout, match="still PROVISIONING") as info:
        client.provision(pod_spec(), timeout=0.1, poll=0.01)
    assert fake.pods == {} and len(fake.calls("DELETE", POD_PATH)) == 1
    assert "nothing is left running" in info.value.__notes__[0]


def test_failure_after_create_terminates_the_pod(client, fake) -> None:
    fake.inject("GET", POD_PATH, Fault(500), times=float("inf"))
    with raises_clean(RunPodUnavailableError, match="HTTP 500"):
        client.provision(pod_spec(), timeout=5, poll=0.01)
    assert fake.pods == {}


def test_terminate_that_failed_after_deleting_succeeds(client, fake) -> None:
    pod = client.create_pod(pod_spec())
    fake.inject("DELETE", POD_PATH, Fault(500, commit=True))
    client.terminate_pod(pod["id"])
    assert fake.pods == {} and len(fake.calls("DELETE", POD_PATH)) == 2


def test_orphan_error_names_pod_and_command(client, fake) -> None:
    fake.stuck = True
    fake.inject("DELETE", POD_PATH, Fault(500), times=float("inf"))
    with raises_clean(RunPodOrphanError) as info:
        client.provision(pod_spec(), timeout=0.1, poll=0.01)
    (pod_id,) = fake.pods
    assert info.value.resource_id == pod_id
    assert info.value.command == f"olmx provision runpod terminate {pod_id}"
    assert info.value.command in str(info.value) and "still PROVISIONING" in str(info.value)


@contextlib.contextmanager
def ctrl_c_while_polling(fake) -> Iterator[None]:
    """Ctrl-C (``KeyboardInterrupt`` in the main thread) once the client has polled the pod it
    created twice: the pod exists, and the client is in its wait loop, however loaded the machine."""
    done = threading.Event()

    def interrupt() -> None:
        while not done.is_set():
            if len(fake.calls("GET", POD_PATH)) >= 2:
                _thread.interrupt_main()
                return
            time.sleep(0.01)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_ctrl_c_while_waiting_terminates_the_pod(client, fake) -> None:
    fake.stuck = True
    with raises_clean(KeyboardInterrupt), ctrl_c_while_polling(fake):
        client.provision(pod_spec(), timeout=30, poll=0.01)
    assert fake.pods == {} and len(fake.calls("DELETE", POD_PATH)) == 1


def test_ctrl_c_and_failing_terminate_gives_the_command(client, fake) -> None:
    fake.stuck = True
    fake.inject("DELETE", POD_PATH, Fault(500), times=float("inf"))
    with raises_clean(RunPodOrphanError, match="KeyboardInterrupt") as info, ctrl_c_while_polling(fake):
        client.provision(pod_spec(), timeout=30, poll=0.01)
    (pod_id,) = fake.pods
    assert f"olmx provision runpod terminate {pod_id}" in str(info.value)


# ------------------------------------------------------------------------------- secrecy


def test_key_echoed_by_the_server_is_scrubbed(client, fake) -> None:
    fake.inject("POST", "/v2/pods", Fault(400, echo_auth=True))
    with raises_clean(RunPodRequestError, match="bad request from Bearer <redacted>"):
        client.create_pod(pod_spec())


def test_client_never_shows_the_key(client) -> None:
    assert KEY not in repr(client) and KEY not in str(client) and KEY not in str(vars(client))
    with pytest.raises(TypeError):
        pickle.dumps(client)


def test_dry_run_rendering(client, fake, monkeypatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    body = build_pod_request(pod_spec(env={"WANDB_MODE": "offline", "HF_TOKEN": "hf_x", "PLAIN": KEY}))
    for text in (
        client.describe("POST", "/v2/pods", body),
        redacted_request("POST", "/v2/pods", body),
    ):
        head, _, payload = text.partition("\n\n")
        assert head.splitlines() == [
            f"POST {fake.base_url}/v2/pods",
            "Authorization: Bearer <redacted>",
            "Content-Type: application/json",
        ]
        shown = json.loads(payload)
        assert shown["env"] == {
            "WANDB_MODE": "offline",
            "HF_TOKEN": "<redacted>",
            "PLAIN": "<redacted>",
        }
        assert {k: v for k, v in shown.items() if k != "env"} == {k: v for k, v in body.items() if k != "env"}
        assert KEY not in text
    assert fake.requests == []  # rendering sends nothing
    assert redacted_request("DELETE", "/v2/pods/p1").splitlines() == [
        f"DELETE {fake.base_url}/v2/pods/p1",
        "Authorization: Bearer <redacted>",
    ]


def test_ssh_endpoint_value_object() -> None:
    assert SshEndpoint("1.2.3.4", 2222).command() == ["ssh", "-p", "2222", "root@1.2.3.4"]
