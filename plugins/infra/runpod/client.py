"""olmx's own small client for RunPod's REST API v2 (standard library only).

Why not the ``runpod`` SDK: its 1.12.0 release speaks GraphQL, which RunPod is retiring, and
imports slowly (docs/research/cli-infra-plugins.md §4.1). This module sends JSON over HTTPS
with :mod:`urllib.request` and follows RunPod's v2 OpenAPI document (``runpod/docs``,
``api-reference-v2/openapi.json``, read 2026-09):

==========================================  ==============================================
``POST /v2/pods``                            create; ``201`` with the pod (``PROVISIONING``)
``GET /v2/pods/{id}``                        one pod
``GET /v2/pods``                             ``{"pods": [...]}``
``POST /v2/pods/{id}/action``                ``{"action": "start"|"stop"}``; ``200`` + pod
``DELETE /v2/pods/{id}``                     terminate; ``204``
``POST /v2/clusters``                        create an instant cluster; ``201``
``GET /v2/clusters[/{id}[/pods]]``           ``{"clusters": [...]}``, one cluster, its pods
``DELETE /v2/clusters/{id}``                 terminate the cluster and its pods; ``204``
==========================================  ==============================================

Errors are RFC 9457 problem objects ``{title, status, detail, errors?}``; ``429`` carries
``Retry-After`` in seconds. Pod statuses: ``PROVISIONING -> STARTING -> RUNNING``, and
``EXITED``, ``ERROR``, ``TERMINATED``. A running pod reports its SSH endpoint in
``ssh.direct = {host, port, username}`` (only when ``22/tcp`` is published) and its port
mappings in ``runtime.ports``.

Choices where sources disagree:

* List responses. The OpenAPI document (``ListPodsResponse``), RunPod's migration guide
  (``api-reference-v2/migrate-from-v1.mdx``: "GET /v2/pods returns {"pods":[...]}") and the
  REST v2 port of runpod-python (PR #584 tests) all give a bare ``{"pods": [...]}`` with no
  pagination. olmx's research note says ``{items, pagination}``; that envelope is what
  RunPod's MCP server returns for its catalog tools (runpod/runpod-mcp PR #46), not the REST
  API. The client reads ``pods`` (or ``clusters``) and, should a response carry
  ``items`` and ``pagination.nextCursor`` instead, also follows the cursor (sent back as the
  query parameter ``cursor``, a guess: no v2 list documents one yet).
* Base URL. ``RUNPOD_API_BASE_URL`` is the host without ``/v2``, as in runpod-python's
  REST transport (``runpod/api/rest.py``); a trailing ``/v2`` (the form RunPod's docs
  print) is accepted and dropped.

Safety rules that the tests hold: the API key is only ever placed in the ``Authorization``
header (unredirected, never over plain HTTP except to localhost); it is never part of a repr,
log line or error message, and errors are raised outside ``except`` blocks so that no
traceback carries urllib frames whose locals hold the header. Retries (``429``, ``5xx``,
timeouts, dropped connections) back off exponentially, honour ``Retry-After`` and stop at a
total time limit. A create whose outcome is unknown (``5xx`` or a timeout after the request
was sent) is never blindly repeated: the client first looks for a new pod or cluster of that
name (one whose id was not there before the create) and adopts it. After a create that needed
such a check, any other new one of that name is terminated, and so is every new one when the
create fails in the end or is interrupted. (A pod that RunPod creates after all these checks
cannot be seen; RunPod offers no idempotency key.) :meth:`RunPodClient.provision` terminates
what it created when anything afterwards fails, Ctrl-C included, and names the exact command
to run when that fails too. Backoff has no jitter: one olmx process makes one call at a time.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, NoReturn

from olmx import __version__
from olmx.errors import LaunchError

from .spec import (
    CLUSTERS_PATH,
    PODS_PATH,
    SSH_PORT,
    ClusterSpec,
    PodSpec,
    build_cluster_request,
    build_pod_request,
)

JSON = dict[str, Any]

#: RunPod's API host; the client appends ``/v2/...``.
DEFAULT_BASE_URL = "https://api.runpod.io"
#: Environment variable that overrides :data:`DEFAULT_BASE_URL` (tests point it at a fake).
BASE_URL_ENV = "RUNPOD_API_BASE_URL"
#: Environment variable holding the API key; it wins over the key file.
API_KEY_ENV = "RUNPOD_API_KEY"
#: Where the key is read from when :data:`API_KEY_ENV` is unset.
DEFAULT_KEY_FILE = "~/.runpod/olmx_api_key"
#: Command printed when olmx could not terminate a pod it created.
TERMINATE_POD_COMMAND = "olmx provision runpod terminate {id}"
#: Command printed when olmx could not terminate a cluster it created.
TERMINATE_CLUSTER_COMMAND = "olmx provision runpod terminate-cluster {id}"

_log = logging.getLogger(__name__)
_USER_AGENT = f"olmx/{__version__} (+urllib)"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_FAILED_STATUSES = {"EXITED", "ERROR", "TERMINATED"}
_SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_REDACTED = "<redacted>"


# ----------------------------------------------------------------------------- errors


class RunPodError(LaunchError):
    """Base of every RunPod failure; the CLI prints its message and exits non-zero."""


class RunPodAuthError(RunPodError):
    """No key, an invalid key (HTTP 401) or a key without access (HTTP 403)."""


class RunPodRequestError(RunPodError):
    """RunPod refused a request (HTTP 4xx); the message carries RunPod's explanation."""

    def __init__(self, message: str, *, status: int, detail: str = "", errors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.errors = errors


class RunPodNotFoundError(RunPodRequestError):
    """The pod or cluster does not exist (HTTP 404); the message names its id."""


class RunPodConflictError(RunPodRequestError):
    """The action is not valid in the resource's current state (HTTP 409)."""


class RunPodUnavailableError(RunPodError):
    """RunPod kept failing (429, 5xx, timeouts) until the retry budget ran out."""


class RunPodPodFailedError(RunPodError):
    """A pod or cluster stopped, failed or vanished while olmx waited for it."""


class RunPodWaitTimeout(RunPodError):
    """A pod or cluster was not running with SSH reachable before the deadline."""


class RunPodOrphanError(RunPodError):
    """Something olmx created could not be terminated; it may still be running and billing."""

    def __init__(self, message: str, *, resource_id: str | None, command: str | None) -> None:
        super().__init__(message)
        self.resource_id = resource_id
        self.command = command


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying 429s, 5xx answers, timeouts and dropped connections."""

    max_attempts: int = 6
    """Requests sent at most, the first one included."""
    base_delay: float = 1.0
    """Delay before the first retry in seconds; doubles with every retry."""
    max_delay: float = 30.0
    """Upper bound of one backoff delay (a longer ``Retry-After`` still wins)."""
    total_time: float = 120.0
    """Upper bound in seconds of all attempts and waits of one call together."""

    def backoff(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1-based), without ``Retry-After``."""
        return min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))


@dataclass(frozen=True)
class SshEndpoint:
    """Where to reach a pod's sshd directly (scp, rsync and port forwarding work)."""

    host: str
    """Public IP or host name."""
    port: int
    """Public TCP port mapped to the pod's port 22."""
    username: str = "root"
    """Login user."""

    def command(self) -> list[str]:
        """``ssh`` argv that opens a shell on the pod."""
        return ["ssh", "-p", str(self.port), f"{self.username}@{self.host}"]


@dataclass(frozen=True)
class ReadyPod:
    """A pod that is ``RUNNING`` with its SSH endpoint published."""

    id: str
    """RunPod pod id."""
    name: str
    """Pod name."""
    ssh: SshEndpoint
    """Direct SSH endpoint."""
    pod: JSON
    """The pod object as RunPod returned it."""


@dataclass(frozen=True)
class ReadyCluster:
    """An instant cluster whose pods are all ``RUNNING`` with SSH published."""

    id: str
    """RunPod cluster id."""
    name: str
    """Cluster name."""
    nodes: tuple[ReadyPod, ...]
    """Member pods ordered by node rank; ``nodes[0]`` is the primary (``NODE_RANK=0``)."""
    cluster: JSON
    """The cluster object as RunPod returned it."""


def ssh_endpoint(pod: Mapping[str, Any]) -> SshEndpoint | None:
    """The direct SSH endpoint of a pod object, or None while it has none.

    Reads ``ssh.direct``; falls back to the ``runtime.ports`` entry mapping private port 22.
    RunPod's ``ssh.proxy`` is ignored: it carries an interactive shell only.
    """
    direct = (pod.get("ssh") or {}).get("direct")
    if direct and direct.get("host") and direct.get("port"):
        return SshEndpoint(str(direct["host"]), int(direct["port"]), str(direct.get("username") or "root"))
    for port in (pod.get("runtime") or {}).get("ports") or []:
        if port.get("private") == 22 and port.get("type") == "tcp" and port.get("ip") and port.get("public"):
            return SshEndpoint(str(port["ip"]), int(port["public"]))
    return None


# ----------------------------------------------------------------------------- helpers


def resolve_base_url(base_url: str | None = None) -> str:
    """The API host to talk to: ``base_url``, else :data:`BASE_URL_ENV`, else RunPod's.

    Refuses plain ``http://`` except to localhost, so the key never travels in clear text.
    """
    url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).strip().rstrip("/")
    url = url.removesuffix("/v2")
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not (parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK)):
        raise RunPodError(
            f"{BASE_URL_ENV}={url!r} is not usable: it must be an https:// URL "
            "(plain http:// only for localhost), so that the API key is never sent in clear text"
        )
    return url


def redacted_request(
    method: str, path: str, body: Mapping[str, Any] | None = None, *, base_url: str | None = None
) -> str:
    """The request olmx would send, as text for ``--dry-run``: method, URL, headers, JSON body.

    The ``Authorization`` header shows ``<redacted>``, and so does the value of every ``env``
    entry whose name looks secret (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ...);
    everything else is exactly what would be sent. Needs no API key.
    """
    lines = [
        f"{method.upper()} {resolve_base_url(base_url)}{path}",
        f"Authorization: Bearer {_REDACTED}",
    ]
    if body is not None:
        shown = dict(body)
        if isinstance(shown.get("env"), Mapping):
            shown["env"] = {k: _REDACTED if _SECRET_ENV_NAME.search(k) else v for k, v in shown["env"].items()}
        lines += ["Content-Type: application/json", "", json.dumps(shown, indent=2)]
    text = "\n".join(lines)
    key = os.environ.get(API_KEY_ENV, "").strip()
    return text.replace(key, _REDACTED) if key else text


class _Secret:
    """Holds the API key; every way of printing it prints ``<redacted>``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the Authorization header only."""
        return self._value

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("the RunPod API key cannot be pickled")


def _load_key(key_file: str | os.PathLike[str] | None) -> tuple[_Secret, str]:
    """The key from :data:`API_KEY_ENV` or the key file, and where it came from."""
    path = Path(key_file or DEFAULT_KEY_FILE).expanduser()
    key, source = os.environ.get(API_KEY_ENV, "").strip(), API_KEY_ENV
    if not key:
        source = str(path)
        try:
            key = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunPodAuthError(f"cannot read the RunPod API key file {path}: {exc.strerror}") from None
    if not key:
        raise RunPodAuthError(
            f"no RunPod API key: set {API_KEY_ENV} or write the key to {path} (chmod 600); "
            "create one at https://www.runpod.io/console/user/settings"
        )
    return _Secret(key), source


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Message
    body: bytes = field(repr=False)  # may echo anything; never shown in tracebacks


@dataclass(frozen=True)
class _Failure:
    """No HTTP answer. ``ambiguous``: the request may have reached RunPod."""

    reason: str
    ambiguous: bool


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is answered as an error, never followed


def _retry_after(headers: Message) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _problem(body: bytes) -> tuple[str, str, tuple[str, ...]]:
    """(title, detail, errors) of an RFC 9457 problem body, tolerating anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        return "", body.decode("utf-8", "replace").strip()[:500], ()
    if not isinstance(data, dict):
        return "", str(data)[:500], ()
    errors = data.get("errors") or ()
    detail = data.get("detail") or data.get("message") or data.get("error") or ""
    return str(data.get("title") or ""), str(detail), tuple(str(e) for e in errors)


# ----------------------------------------------------------------------------- client


class RunPodClient:
    """A small, careful client for the part of RunPod's REST API v2 olmx uses.

    Build one with :meth:`from_env` (key from ``RUNPOD_API_KEY`` or a key file, base URL from
    ``RUNPOD_API_BASE_URL``). Every call retries transient failures under ``retry`` and
    raises a :class:`RunPodError` subclass with a message meant for the user.
    """

    def __init__(
        self,
        api_key: str | _Secret,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        key_source: str = "the API key",
    ) -> None:
        """``timeout``: seconds one HTTP request may take; ``key_source``: where the key came
        from, named (never shown) in authentication errors."""
        self._key = api_key if isinstance(api_key, _Secret) else _Secret(api_key)
        del api_key  # no frame of a traceback raised below may hold the key in its locals
        if not re.fullmatch(r"[\x21-\x7e]+", self._key.reveal() or ""):
            raise RunPodAuthError(
                f"the RunPod API key from {key_source} is empty or contains spaces or non-ASCII characters"
            )
        self._key_source = key_source
        self.base_url = resolve_base_url(base_url)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        loopback = urllib.parse.urlsplit(self.base_url).hostname in _LOOPBACK
        proxies = urllib.request.ProxyHandler({} if loopback else None)
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    @classmethod
    def from_env(cls, *, key_file: str | os.PathLike[str] | None = None, **kwargs: Any) -> RunPodClient:
        """A client whose key is ``$RUNPOD_API_KEY`` or the content of ``key_file``
        (default ``~/.runpod/olmx_api_key``); other arguments as for the constructor."""
        secret, source = _load_key(key_file)
        return cls(secret, key_source=source, **kwargs)

    def __repr__(self) -> str:
        return f"RunPodClient(base_url={self.base_url!r}, api_key={_REDACTED})"

    def describe(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> str:
        """:func:`redacted_request` against this client's base URL, this key scrubbed too."""
        return self._scrub(redacted_request(method, path, body, base_url=self.base_url))

    # -- pods ----------------------------------------------------------------------

    def create_pod(self, spec: PodSpec | Mapping[str, Any]) -> JSON:
        """Create a pod from a :class:`PodSpec` (or a ready v2 body); returns the new pod."""
        body = build_pod_request(spec) if isinstance(spec, PodSpec) else dict(spec)
        return self._create("pod", PODS_PATH, body, self.list_pods, self.terminate_pod)

    def get_pod(self, pod_id: str) -> JSON:
        """The pod object; :class:`RunPodNotFoundError` names ``pod_id`` when there is none."""
        return self._request("GET", f"{PODS_PATH}/{_quote(pod_id)}", resource=f"pod {pod_id!r}")

    def list_pods(self, *, name: str | None = None, include_cluster_pods: bool = False) -> list[JSON]:
        """All pods of the account (cluster members only if asked), optionally one name's."""
        query = {"includeClusterPods": "true"} if include_cluster_pods else {}
        return [p for p in self._list(PODS_PATH, "pods", query) if name is None or p.get("name") == name]

    def stop_pod(self, pod_id: str) -> JSON:
        """Stop a pod (its container disk is wiped); returns the pod. Stopping a stopped pod
        is not an error."""
        return self._action(pod_id, "stop", done={"EXITED"})

    def start_pod(self, pod_id: str) -> JSON:
        """Start a stopped pod; returns the pod. Starting a starting or running pod is not an
        error."""
        return self._action(pod_id, "start", done={"PROVISIONING", "STARTING", "RUNNING"})

    def terminate_pod(self, pod_id: str) -> None:
        """Terminate and delete a pod for good."""
        self._request("DELETE", f"{PODS_PATH}/{_quote(pod_id)}", resource=f"pod {pod_id!r}")

    def wait_until_running(self, pod_id: str, *, timeout: float = 900.0, poll: float = 5.0) -> ReadyPod:
        """Poll until the pod is ``RUNNING`` with its SSH endpoint published.

        Raises :class:`RunPodWaitTimeout` after ``timeout`` seconds and
        :class:`RunPodPodFailedError` as soon as the pod exits, fails or is terminated.
        """
        deadline = time.monotonic() + timeout
        while True:
            pod = self.get_pod(pod_id)
            status = pod.get("status")
            if status in _FAILED_STATUSES:
                raise RunPodPodFailedError(f"pod {pod_id} is {status} instead of starting")
            ssh = ssh_endpoint(pod) if status == "RUNNING" else None
            if ssh is not None:
                return ReadyPod(id=pod_id, name=str(pod.get("name", "")), ssh=ssh, pod=pod)
            if status == "RUNNING" and SSH_PORT not in (pod.get("ports") or []):
                raise RunPodPodFailedError(
                    f"pod {pod_id} is running but does not publish {SSH_PORT}; olmx cannot reach it"
                )
            if time.monotonic() + poll > deadline:
                raise RunPodWaitTimeout(f"pod {pod_id} is still {status} (not running with SSH) after {timeout:g} s")
            time.sleep(poll)

    # -- clusters ------------------------------------------------------------------

    def create_cluster(self, spec: ClusterSpec | Mapping[str, Any]) -> JSON:
        """Create an instant cluster from a :class:`ClusterSpec` (or a ready v2 body)."""
        body = build_cluster_request(spec) if isinstance(spec, ClusterSpec) else dict(spec)
        return self._create("cluster", CLUSTERS_PATH, body, self.list_clusters, self.terminate_cluster)

    def get_cluster(self, cluster_id: str) -> JSON:
        """The cluster object (its ``pods`` field is only a summary)."""
        return self._request("GET", f"{CLUSTERS_PATH}/{_quote(cluster_id)}", resource=f"cluster {cluster_id!r}")

    def list_clusters(self, *, name: str | None = None) -> list[JSON]:
        """All instant clusters of the account, optionally only those called ``name``."""
        return [c for c in self._list(CLUSTERS_PATH, "clusters", {}) if name is None or c.get("name") == name]

    def list_cluster_pods(self, cluster_id: str) -> list[JSON]:
        """The member pods of a cluster, as full pod objects."""
        path = f"{CLUSTERS_PATH}/{_quote(cluster_id)}/pods"
        return self._list(path, "pods", {}, resource=f"cluster {cluster_id!r}")

    def terminate_cluster(self, cluster_id: str) -> None:
        """Delete a cluster and terminate all its pods."""
        self._request("DELETE", f"{CLUSTERS_PATH}/{_quote(cluster_id)}", resource=f"cluster {cluster_id!r}")

    def wait_until_cluster_running(
        self, cluster_id: str, *, timeout: float = 1200.0, poll: float = 10.0
    ) -> ReadyCluster:
        """Poll until every member pod is ``RUNNING`` with SSH published."""
        deadline = time.monotonic() + timeout
        while True:
            cluster = self.get_cluster(cluster_id)
            want = int(cluster.get("compute", {}).get("podCount", 0))
            by_status: Mapping[str, int] = (cluster.get("pods") or {}).get("byStatus") or {}
            failed = {s: n for s, n in by_status.items() if s in _FAILED_STATUSES and n}
            if failed:
                raise RunPodPodFailedError(f"cluster {cluster_id}: member pods {failed} instead of starting")
            if want and by_status.get("RUNNING", 0) == want:
                nodes = self._ready_nodes(cluster_id)
                if len(nodes) == want:
                    return ReadyCluster(
                        id=cluster_id,
                        name=str(cluster.get("name", "")),
                        nodes=nodes,
                        cluster=cluster,
                    )
            if time.monotonic() + poll > deadline:
                raise RunPodWaitTimeout(
                    f"cluster {cluster_id} is not running with SSH after {timeout:g} s (pods: {dict(by_status)})"
                )
            time.sleep(poll)

    def _ready_nodes(self, cluster_id: str) -> tuple[ReadyPod, ...]:
        ready = []
        for pod in self.list_cluster_pods(cluster_id):
            ssh = ssh_endpoint(pod) if pod.get("status") == "RUNNING" else None
            if ssh is not None:
                rank = (pod.get("cluster") or {}).get("rank")
                ready.append(
                    (
                        rank if rank is not None else 1 << 30,
                        ReadyPod(str(pod["id"]), str(pod.get("name", "")), ssh, pod),
                    )
                )
        return tuple(node for _, node in sorted(ready, key=lambda item: item[0]))

    # -- provisioning --------------------------------------------------------------

    def provision(
        self, spec: PodSpec | ClusterSpec, *, timeout: float = 1200.0, poll: float = 10.0
    ) -> ReadyPod | ReadyCluster:
        """Create a pod (or cluster) and wait until it runs with SSH, leaving no orphan.

        If anything fails once it exists (the wait times out, the pod fails, RunPod stops
        answering, Ctrl-C), the pod is terminated before the error propagates. If that fails
        too, :class:`RunPodOrphanError` names its id and the command that terminates it.
        """
        if isinstance(spec, ClusterSpec):
            kind, command = "cluster", TERMINATE_CLUSTER_COMMAND
            resource_id = str(self.create_cluster(spec)["id"])
            terminate: Callable[[str], None] = self.terminate_cluster
            wait: Callable[..., ReadyPod | ReadyCluster] = self.wait_until_cluster_running
        else:
            kind, command = "pod", TERMINATE_POD_COMMAND
            resource_id = str(self.create_pod(spec)["id"])
            terminate, wait = self.terminate_pod, self.wait_until_running
        _log.info("RunPod %s %s created; waiting until it runs", kind, resource_id)
        try:
            return wait(resource_id, timeout=timeout, poll=poll)
        except BaseException as exc:
            self.terminate_after_failure(kind, resource_id, terminate, command.format(id=resource_id), exc)
            raise

    def terminate_after_failure(
        self,
        kind: str,
        resource_id: str,
        terminate: Callable[[str], None],
        command: str,
        exc: BaseException,
    ) -> None:
        """Terminate ``resource_id`` after ``exc`` ended its use early (nothing of value is on
        it yet); a note on ``exc`` says so. When terminating fails too, raise
        :class:`RunPodOrphanError` naming the resource and ``command``."""
        what = f"{type(exc).__name__}: {self._scrub(str(exc))}".rstrip(": ")
        _log.warning("provisioning RunPod %s %s failed (%s); terminating it", kind, resource_id, what)
        problem = None
        try:
            terminate(resource_id)
        except RunPodNotFoundError:
            pass
        except BaseException as cleanup_exc:  # a second Ctrl-C included: say what is left
            problem = f"{type(cleanup_exc).__name__}: {self._scrub(str(cleanup_exc))}".rstrip(": ")
        if problem is None:
            exc.add_note(f"olmx terminated RunPod {kind} {resource_id}; nothing is left running.")
            _log.warning("terminated RunPod %s %s", kind, resource_id)
            return
        raise RunPodOrphanError(
            f"provisioning RunPod {kind} {resource_id} failed ({what}) and terminating it "
            f"failed too ({problem}). It may still be running and billing. Terminate it "
            f"with:\n    {command}",
            resource_id=resource_id,
            command=command,
        ) from None

    # -- plumbing ------------------------------------------------------------------

    def _action(self, pod_id: str, action: str, *, done: set[str]) -> JSON:
        path = f"{PODS_PATH}/{_quote(pod_id)}/action"
        try:
            return self._request("POST", path, {"action": action}, resource=f"pod {pod_id!r}")
        except RunPodConflictError:
            pod = self.get_pod(pod_id)  # already where we wanted it (or a retry already moved it)?
            if pod.get("status") in done:
                return pod
            raise

    def _create(
        self,
        kind: str,
        path: str,
        body: JSON,
        list_named: Callable[..., list[JSON]],
        terminate: Callable[[str], None],
    ) -> JSON:
        """POST a create without ever leaving a duplicate behind (see the module docstring)."""
        name = str(body.get("name", ""))
        before = {x.get("id") for x in list_named(name=name)}
        checked = False

        def recover(reason: str) -> JSON | None:
            nonlocal checked
            checked = True
            try:
                new = [x for x in list_named(name=name) if x.get("id") not in before]
            except RunPodError as exc:
                raise RunPodOrphanError(
                    f"creating RunPod {kind} {name!r} failed ({reason}) and olmx could not "
                    f"check whether RunPod created it anyway ({self._scrub(str(exc))}). Look "
                    f"for a {kind} named {name!r} with `olmx provision runpod list` and "
                    "terminate it.",
                    resource_id=None,
                    command=None,
                ) from None
            if new:
                _log.warning(
                    "RunPod created %s %s although the request failed (%s); using it",
                    kind,
                    new[0].get("id"),
                    reason,
                )
            return new[0] if new else None

        try:
            created = self._request("POST", path, body, recover=recover)
        except (KeyboardInterrupt, RunPodError) as exc:
            if checked or isinstance(exc, KeyboardInterrupt):  # a request may have created one
                self._terminate_new(kind, name, before, list_named, terminate)
            raise
        if checked:  # a retried create may have created twice
            self._terminate_new(kind, name, before | {created.get("id")}, list_named, terminate)
        return created

    def _terminate_new(
        self,
        kind: str,
        name: str,
        known: set[Any],
        list_named: Callable[..., list[JSON]],
        terminate: Callable[[str], None],
    ) -> None:
        """Terminate every pod (or cluster) called ``name`` whose id is not in ``known``."""
        try:
            for extra in [x["id"] for x in list_named(name=name) if x.get("id") not in known]:
                _log.warning("terminating RunPod %s %s left by an interrupted or retried create", kind, extra)
                terminate(str(extra))
        except RunPodError as exc:
            raise RunPodOrphanError(
                f"a RunPod {kind} named {name!r} may have been created twice or by an "
                f"interrupted request, and olmx could not clean up ({self._scrub(str(exc))}). "
                f"Look for {kind}s named {name!r} with `olmx provision runpod list` and "
                "terminate the extra ones.",
                resource_id=None,
                command=None,
            ) from None

    def _list(self, path: str, key: str, query: Mapping[str, str], resource: str | None = None) -> list[JSON]:
        items: list[JSON] = []
        cursors: set[str] = set()
        params = dict(query)
        while True:
            data = self._request("GET", path, query=params, resource=resource)
            page = data.get(key, data.get("items"))
            if not isinstance(page, list):
                raise RunPodError(f"unexpected answer to GET {path}: no {key!r} list in it")
            items.extend(page)
            cursor = (data.get("pagination") or {}).get("nextCursor")
            if not cursor or cursor in cursors:
                return items
            cursors.add(cursor)
            params = {**query, "cursor": str(cursor)}

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        resource: str | None = None,
        recover: Callable[[str], JSON | None] | None = None,
    ) -> JSON:
        """Send one API call with retries; the decoded JSON object (``{}`` for ``204``).

        ``recover`` is called after a failure that may have been applied (``5xx``, timeout)
        and may return the result instead of retrying (used by creates).
        """
        url_path = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        payload = None if body is None else json.dumps(body).encode("utf-8")
        start = time.monotonic()
        ambiguous_before = False
        for attempt in range(1, self.retry.max_attempts + 1):
            budget = self.retry.total_time - (time.monotonic() - start)
            outcome = self._send(method, url_path, payload, timeout=max(0.001, min(self.timeout, budget)))
            retry_after = None
            if isinstance(outcome, _Response):
                _log.debug("RunPod %s %s -> HTTP %d", method, url_path, outcome.status)
                if outcome.status < 300:
                    return self._decode(method, path, outcome)
                if outcome.status == 404 and method == "DELETE" and ambiguous_before:
                    return {}  # an earlier attempt that "failed" did delete it
                if outcome.status != 429 and outcome.status < 500:
                    self._raise_http(method, path, outcome, resource)
                reason, ambiguous = f"HTTP {outcome.status}", outcome.status >= 500
                retry_after = _retry_after(outcome.headers)
            else:
                reason, ambiguous = outcome.reason, outcome.ambiguous
            ambiguous_before = ambiguous_before or ambiguous
            if ambiguous and recover is not None and (found := recover(reason)) is not None:
                return found
            delay = max(self.retry.backoff(attempt), retry_after or 0.0)
            elapsed = time.monotonic() - start
            if attempt == self.retry.max_attempts or elapsed + delay >= self.retry.total_time:
                asked = f"; RunPod asked to wait {retry_after:g} s" if retry_after else ""
                raise RunPodUnavailableError(
                    f"RunPod did not answer {method} {path} successfully: {reason} after "
                    f"{attempt} attempt(s) in {elapsed:.1f} s{asked} (retry budget "
                    f"{self.retry.total_time:g} s). Try again later; https://status.runpod.io "
                    "shows outages."
                )
            _log.warning(
                "RunPod %s %s: %s; retry %d/%d in %.2f s",
                method,
                path,
                reason,
                attempt,
                self.retry.max_attempts - 1,
                delay,
            )
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, url_path: str, payload: bytes | None, *, timeout: float) -> _Response | _Failure:
        """One HTTP exchange. Never raises for network trouble: errors are built by the
        caller outside any ``except`` block, so no urllib frame (whose locals hold the
        Authorization header) ends up in a traceback."""
        request = urllib.request.Request(self.base_url + url_path, data=payload, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", _USER_AGENT)
        if payload is not None:
            request.add_header("Content-Type", "application/json")
        request.add_unredirected_header("Authorization", "Bearer " + self._key.reveal())
        outcome: _Response | _Failure | None = None
        try:
            with self._opener.open(request, timeout=timeout) as response:
                outcome = _Response(response.status, response.headers, response.read())
        except KeyboardInterrupt:
            pass  # re-raised below, without the urllib frames
        except urllib.error.HTTPError as exc:
            try:
                outcome = _Response(exc.code, exc.headers, exc.read())
            except (OSError, http.client.HTTPException):
                outcome = _Response(exc.code, exc.headers, b"")
        except urllib.error.URLError as exc:
            not_sent = isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror))
            outcome = _Failure(f"{type(exc.reason).__name__}: {exc.reason}", ambiguous=not not_sent)
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets while reading
            outcome = _Failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, ambiguous=True)
        if outcome is None:
            raise KeyboardInterrupt
        return outcome

    def _decode(self, method: str, path: str, response: _Response) -> JSON:
        if response.status == 204 or not response.body.strip():
            return {}
        try:
            data = json.loads(response.body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise RunPodError(f"RunPod answered {method} {path} with HTTP {response.status} but no JSON object")
        return data

    def _raise_http(self, method: str, path: str, response: _Response, resource: str | None) -> NoReturn:
        status = response.status
        title, detail, errors = _problem(response.body)
        detail, errors = self._scrub(detail), tuple(self._scrub(e) for e in errors)
        said = f": {detail}" if detail else ""
        if status == 401:
            raise RunPodAuthError(
                f"RunPod rejected the API key from {self._key_source} (HTTP 401: missing, "
                "malformed, expired or invalid). Create a key at "
                f"https://www.runpod.io/console/user/settings and set {API_KEY_ENV}."
            )
        if status == 403:
            raise RunPodAuthError(
                f"the RunPod API key from {self._key_source} is valid but may not {method} "
                f"{path} (HTTP 403{said}); give the key read/write access to pods and clusters"
            )
        where = f"{method} {path}"
        if status == 404:
            raise RunPodNotFoundError(
                f"RunPod has no {resource or 'such resource'} (HTTP 404 on {where}{said})",
                status=status,
                detail=detail,
            )
        listed = "".join(f"\n  - {e}" for e in errors)
        message = f"RunPod refused {where} (HTTP {status}{' ' + title if title else ''}){said}{listed}"
        cls = RunPodConflictError if status == 409 else RunPodRequestError
        raise cls(message, status=status, detail=detail, errors=errors)

    def _scrub(self, text: str) -> str:
        """``text`` with this client's key replaced, should RunPod ever echo it back."""
        return text.replace(self._key.reveal(), _REDACTED)


def _quote(resource_id: str) -> str:
    return urllib.parse.quote(str(resource_id), safe="")
