"""The RunPod REST v2 resources olmx uses: pods and instant clusters, as methods of one class.

The endpoints follow RunPod's v2 OpenAPI document (``runpod/docs``,
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
``GET|PUT /v2/account/ssh-keys``             ``{"keys": [...]}``: the keys ``startSsh`` installs
==========================================  ==============================================

Pod statuses: ``PROVISIONING -> STARTING -> RUNNING``, and ``EXITED``, ``ERROR``,
``TERMINATED``. A running pod reports its SSH endpoint in ``ssh.direct = {host, port,
username}`` (only when ``22/tcp`` is published) and its port mappings in ``runtime.ports``
(:func:`ssh_endpoint` reads them).

List responses, where sources disagree: the OpenAPI document (``ListPodsResponse``),
RunPod's migration guide (``api-reference-v2/migrate-from-v1.mdx``: "GET /v2/pods returns
{"pods":[...]}") and the REST v2 port of runpod-python (PR #584 tests) all give a bare
``{"pods": [...]}`` with no pagination. olmx's research note says ``{items, pagination}``;
that envelope is what RunPod's MCP server returns for its catalog tools (runpod/runpod-mcp
PR #46), not the REST API. The client reads ``pods`` (or ``clusters``) and, should a response
carry ``items`` and ``pagination.nextCursor`` instead, also follows the cursor (sent back as
the query parameter ``cursor``, a guess: no v2 list documents one yet).

Creates never leave a duplicate behind. A create whose outcome is unknown (``5xx`` or a
timeout after the request was sent) is never blindly repeated: the client first looks for a
new pod or cluster of that name (one whose id was not there before the create) and adopts it.
After a create that needed such a check, any other new one of that name is terminated, and so
is every new one when the create fails in the end or is interrupted. (A pod that RunPod
creates after all these checks cannot be seen; RunPod offers no idempotency key.)
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import RunPodConflictError, RunPodError, RunPodOrphanError
from .spec import (
    CLUSTERS_PATH,
    PODS_PATH,
    ClusterSpec,
    PodSpec,
    build_cluster_request,
    build_pod_request,
)
from .transport import JSON, RunPodTransport

_log = logging.getLogger(__name__)
#: The account's registered SSH public keys.
SSH_KEYS_PATH = "/v2/account/ssh-keys"


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


class RunPodRest(RunPodTransport):
    """The pod and cluster endpoints of RunPod's REST API v2 that olmx uses, over
    :class:`~.transport.RunPodTransport`; :class:`~.provision.RunPodClient` adds the waits and
    the provisioning flow."""

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

    # -- account -------------------------------------------------------------------

    def ssh_keys(self) -> list[str]:
        """The account's registered SSH public keys (``authorized_keys`` lines), which RunPod
        installs into pods created with ``startSsh``."""
        keys = self._request("GET", SSH_KEYS_PATH).get("keys")
        if not isinstance(keys, list):
            raise RunPodError(f"unexpected answer to GET {SSH_KEYS_PATH}: no 'keys' list in it")
        return [str(k) for k in keys]

    def set_ssh_keys(self, keys: list[str]) -> list[str]:
        """Replace the account's registered SSH public keys with ``keys`` (the whole set);
        returns the new set. Pods created afterwards get them."""
        answer = self._request("PUT", SSH_KEYS_PATH, {"keys": list(keys)})
        return [str(k) for k in answer.get("keys", [])]

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


def _quote(resource_id: str) -> str:
    return urllib.parse.quote(str(resource_id), safe="")
