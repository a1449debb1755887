"""RunPod support of olmx: its own small REST v2 client and the request bodies it sends.

* :mod:`.spec`: :class:`PodSpec` / :class:`ClusterSpec` and the pure functions that turn them
  into the exact ``POST /v2/pods`` / ``POST /v2/clusters`` bodies.
* :mod:`.errors`: the :class:`RunPodError` tree.
* :mod:`.transport`: the key, the base URL, one JSON call with retries, and
  :func:`redacted_request` for ``--dry-run``.
* :mod:`.rest`: the pod and cluster endpoints (creates that leave no duplicate).
* :mod:`.provision`: :class:`RunPodClient` (waits, provisioning that leaves no orphan).
* :mod:`.plugin` (the ``infra=runpod`` plugin, settings in :mod:`.config`), :mod:`.payload`
  (what is shipped to a pod), :mod:`.remote` (SSH steps), :mod:`.commands`
  (``olmx provision runpod``).

Names are re-exported lazily (PEP 562), so importing this package costs nothing until one is
used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "spec": (
        "CLUSTERS_PATH",
        "PODS_PATH",
        "CloudType",
        "ClusterSpec",
        "ClusterType",
        "PodSpec",
        "build_cluster_request",
        "build_pod_request",
    ),
    "errors": (
        "RunPodAuthError",
        "RunPodConflictError",
        "RunPodError",
        "RunPodNotFoundError",
        "RunPodOrphanError",
        "RunPodPodFailedError",
        "RunPodRequestError",
        "RunPodUnavailableError",
        "RunPodWaitTimeout",
    ),
    "transport": (
        "RetryPolicy",
        "redacted_request",
        "resolve_base_url",
    ),
    "rest": (
        "SshEndpoint",
        "ssh_endpoint",
    ),
    "provision": (
        "TERMINATE_CLUSTER_COMMAND",
        "TERMINATE_POD_COMMAND",
        "ReadyCluster",
        "ReadyPod",
        "RunPodClient",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
