"""Provisioning on RunPod: wait until pods run with SSH, and create-wait-terminate without orphans.

:class:`RunPodClient` is the client olmx uses: the REST resources of :mod:`.rest` plus the
waits (poll until a pod, or every member pod of a cluster, is ``RUNNING`` with its SSH
endpoint published) and :meth:`RunPodClient.provision`, which terminates what it created when
anything afterwards fails, Ctrl-C included, and names the exact command to run when that
fails too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .errors import (
    RunPodNoCapacityError,
    RunPodNotFoundError,
    RunPodOrphanError,
    RunPodPodFailedError,
    RunPodRequestError,
    RunPodWaitTimeout,
)
from .rest import RunPodRest, SshEndpoint, ssh_endpoint
from .spec import SSH_PORT, ClusterSpec, PodSpec
from .transport import JSON

#: Command printed when olmx could not terminate a pod it created.
TERMINATE_POD_COMMAND = "olmx provision runpod terminate {id}"
#: Command printed when olmx could not terminate a cluster it created.
TERMINATE_CLUSTER_COMMAND = "olmx provision runpod terminate-cluster {id}"

_log = logging.getLogger(__name__)
_FAILED_STATUSES = {"EXITED", "ERROR", "TERMINATED"}
#: Create answers after which the next candidate is tried (RunPod's API reference, createPod).
#: (Its 403, "no access to this pool", is left fatal: far more often the key lacks write access.)
_NEXT_CANDIDATE = {400}


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


class RunPodClient(RunPodRest):
    """A small, careful client for the part of RunPod's REST API v2 olmx uses.

    Build one with :meth:`from_env` (key from ``RUNPOD_API_KEY`` or a key file, base URL from
    ``RUNPOD_API_BASE_URL``). Every call retries transient failures under ``retry`` and
    raises a :class:`~.errors.RunPodError` subclass with a message meant for the user. The
    HTTP side is :class:`~.transport.RunPodTransport`, the endpoints :class:`~.rest.RunPodRest`;
    this class adds waiting and provisioning.
    """

    # -- waiting -------------------------------------------------------------------

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
        return self.provision_first([("", spec)], timeout=timeout, poll=poll)

    def provision_first(
        self,
        tries: Sequence[tuple[str, PodSpec | ClusterSpec]],
        *,
        on_miss: Callable[[str, str], object] | None = None,
        timeout: float = 1200.0,
        poll: float = 10.0,
    ) -> ReadyPod | ReadyCluster:
        """:meth:`provision` of the first of ``tries`` (``(label, spec)``, in order of
        preference) that RunPod creates, as RunPod's API reference advises: a ``400`` (no
        capacity for that GPU type and data centre, or a rule the request breaks) moves on to
        the next, calling ``on_miss(label, reason)``; a ``402`` (balance too low), ``403`` or
        any other failure ends the search. When every one is refused,
        :class:`RunPodNoCapacityError` lists each try and its reason."""
        misses: list[str] = []
        for label, spec in tries:
            try:
                if isinstance(spec, ClusterSpec):
                    kind, command = "cluster", TERMINATE_CLUSTER_COMMAND
                    resource_id = str(self.create_cluster(spec)["id"])
                    terminate: Callable[[str], None] = self.terminate_cluster
                    wait: Callable[..., ReadyPod | ReadyCluster] = self.wait_until_cluster_running
                else:
                    kind, command = "pod", TERMINATE_POD_COMMAND
                    resource_id = str(self.create_pod(spec)["id"])
                    terminate, wait = self.terminate_pod, self.wait_until_running
            except RunPodRequestError as exc:
                if exc.status not in _NEXT_CANDIDATE or len(tries) == 1:
                    raise
                reason = exc.detail or str(exc)
                misses.append(f"{label}: HTTP {exc.status}, {reason}")
                _log.info("RunPod refused %s (HTTP %s: %s)", label, exc.status, reason)
                if on_miss is not None:
                    on_miss(label, reason)
                continue
            _log.info("RunPod %s %s created (%s); waiting until it runs", kind, resource_id, label or spec.name)
            try:
                return wait(resource_id, timeout=timeout, poll=poll)
            except BaseException as exc:
                self.terminate_after_failure(kind, resource_id, terminate, command.format(id=resource_id), exc)
                raise
        raise RunPodNoCapacityError(
            f"RunPod created none of the {len(tries)} candidates:\n  "
            + "\n  ".join(misses)
            + "\nAdd GPU types (infra.gpu_types) or data centres (infra.data_centers), or try again later. RunPod "
            "answers 400 both for no capacity and for a request it will not take: when every try gets the same "
            "400, read its reason as a problem with the request.",
            status=400,
            detail=misses[-1] if misses else "",
        )

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
