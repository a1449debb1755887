"""A fake RunPod REST API v2 for tests: a real threaded HTTP server on 127.0.0.1.

It speaks the subset olmx uses (pods: create, get, list, action, delete; clusters: create,
get, list, list pods, delete; the account's SSH keys: get, put), with the shapes of RunPod's v2 OpenAPI document
(``runpod/docs`` ``api-reference-v2/openapi.json``): RFC 9457 problem bodies, ``201`` on
create, ``204`` on delete, ``{"pods": [...]}`` / ``{"clusters": [...]}`` lists, pod statuses
``PROVISIONING -> STARTING -> RUNNING`` advanced by each ``GET`` of the pod, ``ssh.direct``
and ``runtime.ports`` filled in once running.

It checks what a client sends: the bearer key (401 when wrong, 403 for ``forbidden_key``),
create bodies against the schema (unknown keys, types, required fields: 422 with an
``errors`` list; cross-field rules such as "exactly one of gpu or cpu": 400).

Fault injection (:meth:`FakeRunPod.inject`): answer the next N matching requests with a
status (429 with ``Retry-After``, 500, ...), after a delay (longer than the client's timeout
to make it time out), optionally after really doing the operation (``commit=True``: "the
create succeeded, then the answer failed"), or echoing the Authorization header in an error.
``stuck = True`` keeps pods in ``PROVISIONING``; ``ssh_after_polls = N`` keeps a pod RUNNING
for N more looks before its SSH port is assigned (``ssh.direct`` null, as RunPod does);
``no_capacity`` names GPU types (or ``"GPU type@data centre"`` pairs) whose creates get RunPod's
400 for no capacity; ``ssh_keys`` are the account's registered SSH keys (none: an account
without keys); ``page_size`` serves lists in pages with an ``{items, pagination: {nextCursor}}``
envelope.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

POD_STATUSES = ("PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR", "TERMINATED")
_CONTAINER_KEYS = {"args", "disk", "env", "image", "ports"}
_POD_KEYS = _CONTAINER_KEYS | {
    "registry",
    "name",
    "cloud",
    "cpu",
    "dataCenterIds",
    "globalNetworking",
    "gpu",
    "mounts",
    "startJupyter",
    "startSsh",
    "templateId",
}
_GPU_KEYS = {
    "id",
    "count",
    "allowedCudaVersions",
    "minCudaVersion",
    "minRamPerGpu",
    "minVcpuCountPerGpu",
}
_CPU_KEYS = {"id", "vcpuCount"}
_CLUSTER_KEYS = _CONTAINER_KEYS | {
    "compute",
    "name",
    "type",
    "dataCenterIds",
    "mounts",
    "startJupyter",
    "startSsh",
}
_PORT_RE = re.compile(r"^\d+/(tcp|http|udp)$")
_KEY_RE = re.compile(r"^(ssh|ecdsa|sk)-[^\s]+ [^\s]+([ \t][^\n\r]*)?$")
_ACTIONS = {
    "PROVISIONING": ["stop", "terminate"],
    "STARTING": ["stop", "terminate"],
    "RUNNING": ["stop", "restart", "terminate"],
    "EXITED": ["start", "terminate"],
    "ERROR": ["start", "terminate"],
}
SSH_HOST = "203.0.113.7"  # TEST-NET-3: documentation address, never routed


@dataclass
class Fault:
    """How to answer a matching request instead of (or after) the normal handling."""

    status: int | None = 500
    """Status to answer with; None: the normal answer (after ``delay``)."""
    retry_after: str | None = None
    """Value of the ``Retry-After`` header."""
    delay: float = 0.0
    """Seconds to sleep before answering."""
    commit: bool = False
    """Do the real operation first (then sleep and answer with ``status``)."""
    echo_auth: bool = False
    """Put the received Authorization header into the error detail."""


@dataclass
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    authorization: str | None = field(repr=False)


@dataclass
class _Rule:
    method: str
    path: re.Pattern[str]
    fault: Fault
    remaining: float


@dataclass
class FakeRunPod:
    """The fake API; use as a context manager or call :meth:`start` / :meth:`stop`."""

    api_key: str
    forbidden_key: str | None = None
    polls_to_running: int = 2
    stuck: bool = False
    page_size: int | None = None
    ssh_after_polls: int = 0
    no_capacity: set[str] = field(default_factory=set)
    ssh_keys: list[str] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._rules: list[_Rule] = []
        self._polls: dict[str, int] = {}
        self._counter = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._handle(self)

            do_POST = do_DELETE = do_PATCH = do_PUT = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True)

    def __repr__(self) -> str:
        return f"FakeRunPod({self.base_url})"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: what ``RUNPOD_API_BASE_URL`` should be."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeRunPod:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeRunPod:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def inject(self, method: str, path: str, fault: Fault, *, times: float = 1) -> None:
        """Answer the next ``times`` requests ``method`` on a path matching the regex ``path``
        (full match) with ``fault``; ``times=float('inf')`` for every one."""
        with self._lock:
            self._rules.append(_Rule(method, re.compile(path), fault, times))

    def calls(self, method: str, path: str) -> list[Recorded]:
        """Recorded requests with this method whose path fully matches the regex ``path``."""
        return [r for r in self.requests if r.method == method and re.fullmatch(path, r.path)]

    # -- HTTP --------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = ValueError
        auth = h.headers.get("Authorization")
        query = parse_qs(url.query)
        with self._lock:
            self.requests.append(Recorded(h.command, url.path, query, body, auth))
            fault = self._take_fault(h.command, url.path)
        if auth != f"Bearer {self.api_key}":
            if self.forbidden_key is not None and auth == f"Bearer {self.forbidden_key}":
                return self._send(h, *_problem(403, "access denied"))
            return self._send(h, *_problem(401, "missing bearer token" if not auth else "invalid bearer token"))
        if fault is not None and fault.echo_auth:
            return self._send(h, *_problem(fault.status or 400, f"bad request from {auth}"))
        if fault is not None and not fault.commit:
            time.sleep(fault.delay)
            if fault.status is not None:
                return self._send(h, *_problem(fault.status, "injected fault"), retry_after=fault.retry_after)
        if body is ValueError:
            return self._send(h, *_problem(400, "request body is not JSON"))
        with self._lock:
            status, payload = self._route(h.command, url.path, query, body)
        if fault is not None and fault.commit:
            time.sleep(fault.delay)
            if fault.status is not None:
                return self._send(
                    h,
                    *_problem(fault.status, "injected fault after commit"),
                    retry_after=fault.retry_after,
                )
        self._send(h, status, payload)

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for rule in self._rules:
            if rule.remaining > 0 and rule.method == method and rule.path.fullmatch(path):
                rule.remaining -= 1
                return rule.fault
        return None

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, payload: Any, *, retry_after: str | None = None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            h.send_response(status)
            kind = "application/problem+json" if status >= 400 else "application/json"
            if data:
                h.send_header("Content-Type", kind)
            h.send_header("Content-Length", str(len(data)))
            if retry_after is not None:
                h.send_header("Retry-After", retry_after)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left

    # -- API ---------------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        routes = (
            ("GET", r"/v2/pods", lambda: self._list_pods(query)),
            ("POST", r"/v2/pods", lambda: self._create_pod(body)),
            ("GET", r"/v2/pods/([^/]+)", lambda i: self._get_pod(i)),
            ("DELETE", r"/v2/pods/([^/]+)", lambda i: self._delete_pod(i)),
            ("POST", r"/v2/pods/([^/]+)/action", lambda i: self._action(i, body)),
            (
                "GET",
                r"/v2/clusters",
                lambda: (200, self._page("clusters", list(self.clusters.values()), query)),
            ),
            ("POST", r"/v2/clusters", lambda: self._create_cluster(body)),
            ("GET", r"/v2/clusters/([^/]+)", lambda i: self._get_cluster(i)),
            ("DELETE", r"/v2/clusters/([^/]+)", lambda i: self._delete_cluster(i)),
            ("GET", r"/v2/clusters/([^/]+)/pods", lambda i: self._cluster_pods(i)),
            ("GET", r"/v2/account/ssh-keys", lambda: (200, {"keys": list(self.ssh_keys)})),
            ("PUT", r"/v2/account/ssh-keys", lambda: self._put_keys(body)),
        )
        for route_method, pattern, handler in routes:
            m = re.fullmatch(pattern, path)
            if m and route_method == method:
                return handler(*m.groups())
        return _problem(404 if method == "GET" else 405, f"no route {method} {path}")

    def _page(self, key: str, items: list[dict[str, Any]], query: dict[str, list[str]]) -> dict[str, Any]:
        if not self.page_size:
            return {key: items}
        start = int(query.get("cursor", ["0"])[0])
        end = start + self.page_size
        return {
            "items": items[start:end],
            "pagination": {"nextCursor": str(end) if end < len(items) else None},
        }

    def _list_pods(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        with_members = query.get("includeClusterPods") == ["true"]
        pods = [p for p in self.pods.values() if with_members or "cluster" not in p]
        return 200, self._page("pods", pods, query)

    def _new_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter:04d}q7"

    def _put_keys(self, body: Any) -> tuple[int, Any]:
        keys = body.get("keys") if isinstance(body, dict) and set(body) == {"keys"} else None
        if not isinstance(keys, list) or not all(isinstance(k, str) and _KEY_RE.fullmatch(k) for k in keys):
            return _problem(422, "Request validation failed.", ["$.keys: an array of authorized_keys lines"])
        self.ssh_keys = list(keys)
        return 200, {"keys": list(self.ssh_keys)}

    def _full(self, gpu_type: str | None, centres: list[str]) -> tuple[int, Any] | None:
        """RunPod's 400 when none of the data centres has capacity for this GPU type."""
        if gpu_type is None:
            return None
        if gpu_type in self.no_capacity or (centres and all(f"{gpu_type}@{c}" in self.no_capacity for c in centres)):
            return _problem(
                400,
                "There are no longer any instances available with the requested specifications. "
                "Please refresh and try again.",
            )
        return None

    def _create_pod(self, body: Any) -> tuple[int, Any]:
        invalid = _validate_pod(body) or self._full((body.get("gpu") or {}).get("id"), body.get("dataCenterIds", []))
        if invalid:
            return invalid
        pod_id = self._new_id("pod")
        self.pods[pod_id] = _new_pod(pod_id, body)
        self._polls[pod_id] = 0
        return 201, self.pods[pod_id]

    def _get_pod(self, pod_id: str) -> tuple[int, Any]:
        pod = self.pods.get(pod_id)
        if pod is None:
            return _problem(404, "pod not found")
        self._advance(pod)
        return 200, pod

    def _advance(self, pod: dict[str, Any]) -> None:
        waiting_for_port = pod["status"] == "RUNNING" and pod["ssh"]["direct"] is None and "22/tcp" in pod["ports"]
        if self.stuck or not (pod["status"] in ("PROVISIONING", "STARTING") or waiting_for_port):
            return
        self._polls[pod["id"]] += 1
        if self._polls[pod["id"]] >= self.polls_to_running + self.ssh_after_polls:
            _set_status(pod, "RUNNING")
        elif self._polls[pod["id"]] >= self.polls_to_running:
            _set_status(pod, "RUNNING", ssh=False)
        else:
            _set_status(pod, "STARTING")

    def _delete_pod(self, pod_id: str) -> tuple[int, Any]:
        pod = self.pods.get(pod_id)
        if pod is None:
            return _problem(404, "pod not found")
        if "cluster" in pod:
            return _problem(409, "pod belongs to a cluster; delete the cluster")
        del self.pods[pod_id]
        return 204, None

    def _action(self, pod_id: str, body: Any) -> tuple[int, Any]:
        if (
            not isinstance(body, dict)
            or set(body) != {"action"}
            or body["action"] not in ("start", "stop", "restart", "terminate")
        ):
            return _problem(
                422,
                "Request validation failed.",
                ["$.action: must be one of start, stop, restart, terminate"],
            )
        pod = self.pods.get(pod_id)
        if pod is None:
            return _problem(404, "pod not found")
        action = body["action"]
        if action not in pod["actions"]:
            return _problem(409, f"cannot {action} a pod that is {pod['status']}")
        if action == "terminate":
            return self._delete_pod(pod_id)
        if action == "start":
            self._polls[pod_id] = 0
        _set_status(pod, {"stop": "EXITED", "start": "PROVISIONING", "restart": "RUNNING"}[action])
        return 200, pod

    def _create_cluster(self, body: Any) -> tuple[int, Any]:
        invalid = _validate_cluster(body) or self._full(body["compute"]["gpuTypeId"], body.get("dataCenterIds", []))
        if invalid:
            return invalid
        cluster_id = self._new_id("cluster")
        compute = body["compute"]
        cluster = {
            "id": cluster_id,
            "name": body["name"],
            "type": body["type"],
            "compute": compute,
            "pods": {"total": 0, "byStatus": {}},
            "createdAt": _now(),
        }
        self.clusters[cluster_id] = cluster
        pod_body = {k: v for k, v in body.items() if k in _CONTAINER_KEYS}
        pod_body["gpu"] = {"id": compute["gpuTypeId"], "count": compute["gpuCountPerPod"]}
        for rank in range(compute["podCount"]):
            pod_id = self._new_id("pod")
            self.pods[pod_id] = _new_pod(pod_id, {**pod_body, "name": f"{body['name']}-node-{rank}"})
            self.pods[pod_id]["cluster"] = {
                "id": cluster_id,
                "rank": rank,
                "ip": f"10.65.0.{rank + 2}",
            }
            self._polls[pod_id] = 0
        self._summarize(cluster)
        return 201, cluster

    def _members(self, cluster_id: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p.get("cluster", {}).get("id") == cluster_id]

    def _summarize(self, cluster: dict[str, Any]) -> None:
        members = self._members(cluster["id"])
        by_status: dict[str, int] = {}
        for pod in members:
            by_status[pod["status"]] = by_status.get(pod["status"], 0) + 1
        cluster["pods"] = {"total": len(members), "byStatus": by_status}
        primary = next((p for p in members if p["cluster"]["rank"] == 0), None)
        if primary is not None:
            cluster["primary"] = {"podId": primary["id"], "status": primary["status"]}
            direct = primary["ssh"]["direct"]
            if direct:
                cluster["primary"]["sshEndpoint"] = f"{direct['host']}:{direct['port']}"

    def _get_cluster(self, cluster_id: str) -> tuple[int, Any]:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            return _problem(404, "cluster not found")
        for pod in self._members(cluster_id):
            self._advance(pod)
        self._summarize(cluster)
        return 200, cluster

    def _cluster_pods(self, cluster_id: str) -> tuple[int, Any]:
        if cluster_id not in self.clusters:
            return _problem(404, "cluster not found")
        return 200, {"pods": self._members(cluster_id)}

    def _delete_cluster(self, cluster_id: str) -> tuple[int, Any]:
        if self.clusters.pop(cluster_id, None) is None:
            return _problem(404, "cluster not found")
        for pod in self._members(cluster_id):
            del self.pods[pod["id"]]
        return 204, None


def _problem(status: int, detail: str, errors: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    titles = {
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        405: "Method Not Allowed",
        409: "Conflict",
        422: "Unprocessable Entity",
        429: "Too Many Requests",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }
    body: dict[str, Any] = {
        "title": titles.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    return status, body


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _new_pod(pod_id: str, body: dict[str, Any]) -> dict[str, Any]:
    gpu = body.get("gpu")
    pod = {
        "id": pod_id,
        "name": body["name"],
        "image": body["image"],
        "args": body.get("args", ""),
        "disk": body.get("disk", 50),
        "ports": list(body.get("ports", [])),
        "env": dict(body.get("env", {})),
        "registry": None,
        "status": "PROVISIONING",
        "actions": [],
        "mounts": body.get("mounts", {}),
        "gpu": _gpu(gpu) if gpu else None,
        "cpu": {"id": body["cpu"]["id"], "vcpuCount": body["cpu"]["vcpuCount"]} if "cpu" in body else None,
        "cloud": body.get("cloud", "SECURE"),
        "dataCenterId": None,
        "cudaVersion": None,
        "ssh": {"proxy": None, "direct": None},
        "template": None,
        "cost": 2.99 * gpu.get("count", 1) if gpu else 0.17,
        "locked": False,
        "globalNetworking": {"enabled": False},
        "runtime": None,
        "createdAt": _now(),
        "startedAt": None,
    }
    _set_status(pod, "PROVISIONING")
    return pod


def _gpu(gpu: dict[str, Any]) -> dict[str, Any]:
    count = gpu.get("count", 1)
    return {"id": gpu["id"], "count": count, "vcpuCount": 16 * count, "memory": 128 * count}


def _set_status(pod: dict[str, Any], status: str, *, ssh: bool = True) -> None:
    """``ssh=False``: running, but no public port assigned to 22/tcp yet."""
    pod["status"] = status
    pod["actions"] = list(_ACTIONS[status])
    running = status == "RUNNING"
    public_port = 40000 + int(re.sub(r"\D", "", pod["id"]) or 0)
    has_ssh = running and ssh and "22/tcp" in pod["ports"]
    pod["ssh"] = {
        "proxy": {
            "host": "ssh.runpod.io",
            "port": 22,
            "username": f"{pod['id']}-64411eb2",
            "command": f"ssh {pod['id']}-64411eb2@ssh.runpod.io",
        }
        if status != "PROVISIONING"
        else None,
        "direct": {
            "host": SSH_HOST,
            "port": public_port,
            "username": "root",
            "command": f"ssh root@{SSH_HOST} -p {public_port}",
        }
        if has_ssh
        else None,
    }
    pod["runtime"] = (
        {
            "uptime": 1,
            "ports": [{"private": 22, "public": public_port, "type": "tcp", "ip": SSH_HOST}] if has_ssh else [],
        }
        if running
        else None
    )
    if running:
        pod["dataCenterId"], pod["cudaVersion"], pod["startedAt"] = "US-TX-3", "12.8", _now()


def _type_errors(body: dict[str, Any], where: str, allowed: set[str]) -> list[str]:
    errors = [f"{where}: additional properties '{k}' not allowed" for k in sorted(set(body) - allowed)]
    checks = {
        "name": lambda v: isinstance(v, str) and len(v) >= 1,
        "image": lambda v: isinstance(v, str),
        "args": lambda v: isinstance(v, str),
        "disk": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "ports": lambda v: isinstance(v, list) and all(isinstance(p, str) and _PORT_RE.match(p) for p in v),
        "env": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        "cloud": lambda v: v in ("SECURE", "COMMUNITY"),
        "startSsh": lambda v: isinstance(v, bool),
        "startJupyter": lambda v: isinstance(v, bool),
        "dataCenterIds": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    }
    errors += [f"{where}.{k}: invalid value {body[k]!r}" for k, ok in checks.items() if k in body and not ok(body[k])]
    return errors


def _mount_errors(body: dict[str, Any]) -> tuple[list[str], str | None]:
    """(schema errors, cross-field rule broken) of ``mounts``."""
    mounts = body.get("mounts")
    if mounts is None:
        return [], None
    if not isinstance(mounts, dict) or set(mounts) - {"persistent", "network"}:
        return [f"$.mounts: invalid value {mounts!r}"], None
    errors = []
    for entry in mounts.get("network", []):
        if not isinstance(entry, dict) or set(entry) != {"volumeId", "path"}:
            errors.append(f"$.mounts.network: invalid entry {entry!r}")
    if len(mounts.get("network", [])) > 1:
        errors.append("$.mounts.network: maxItems 1")
    persistent = mounts.get("persistent")
    if persistent is not None and (set(persistent) != {"size", "path"} or persistent["size"] < 10):
        errors.append(f"$.mounts.persistent: invalid value {persistent!r}")
    both = "persistent" in mounts and "network" in mounts
    return errors, "mounts: at most one of persistent or network may be set" if both else None


def _validate_pod(body: Any) -> tuple[int, Any] | None:
    if not isinstance(body, dict):
        return _problem(422, "Request validation failed.", ["$: expected an object"])
    errors = _type_errors(body, "$", _POD_KEYS)
    errors += [f"$: missing required property '{k}'" for k in ("name",) if k not in body]
    if "image" not in body and "templateId" not in body:
        errors.append("$: missing required property 'image'")
    gpu = body.get("gpu")
    if gpu is not None:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("id"), str):
            errors.append("$.gpu: missing required property 'id'")
        else:
            errors += [f"$.gpu: additional properties '{k}' not allowed" for k in sorted(set(gpu) - _GPU_KEYS)]
            count = gpu.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                errors.append(f"$.gpu.count: invalid value {count!r}")
    cpu = body.get("cpu")
    if cpu is not None:
        if not isinstance(cpu, dict) or set(cpu) != _CPU_KEYS:
            errors.append(f"$.cpu: must have exactly the properties {sorted(_CPU_KEYS)}")
        elif not isinstance(cpu["id"], str) or not isinstance(cpu["vcpuCount"], int) or cpu["vcpuCount"] < 1:
            errors.append(f"$.cpu: invalid value {cpu!r}")
    mount_errors, rule = _mount_errors(body)
    errors += mount_errors
    if errors:
        return _problem(422, "Request validation failed.", errors)
    if ("gpu" in body) == ("cpu" in body):
        return _problem(400, "exactly one of gpu or cpu must be set")
    if rule:
        return _problem(400, rule)
    return None


def _validate_cluster(body: Any) -> tuple[int, Any] | None:
    if not isinstance(body, dict):
        return _problem(422, "Request validation failed.", ["$: expected an object"])
    errors = _type_errors(body, "$", _CLUSTER_KEYS)
    errors += [f"$: missing required property '{k}'" for k in ("name", "type", "compute") if k not in body]
    if body.get("type", "TRAINING") not in ("APPLICATION", "TRAINING", "SLURM", "RAY"):
        errors.append(f"$.type: invalid value {body['type']!r}")
    compute = body.get("compute")
    if compute is not None:
        ok = (
            isinstance(compute, dict)
            and set(compute) == {"gpuTypeId", "gpuCountPerPod", "podCount"}
            and isinstance(compute["gpuTypeId"], str)
            and isinstance(compute["gpuCountPerPod"], int)
            and compute["gpuCountPerPod"] >= 1
            and isinstance(compute["podCount"], int)
            and 2 <= compute["podCount"] <= 250
        )
        if not ok:
            errors.append(f"$.compute: invalid value {compute!r}")
    mount_errors, rule = _mount_errors(body)
    errors += mount_errors
    if errors:
        return _problem(422, "Request validation failed.", errors)
    if rule:
        return _problem(400, rule)
    return None
