"""What olmx asks RunPod for, and the exact REST v2 request bodies that ask for it.

Pure functions, no I/O: :func:`build_pod_request` turns a :class:`PodSpec` into the body of
``POST /v2/pods`` and :func:`build_cluster_request` turns a :class:`ClusterSpec` into the body
of ``POST /v2/clusters``. Both validate first and raise :class:`olmx.errors.ConfigError`
naming the field, so a bad spec fails before any request (and in ``--dry-run``).

Shapes follow RunPod's REST v2 OpenAPI document (``runpod/docs``,
``api-reference-v2/openapi.json``, schemas ``CreatePodRequest``, ``CreateGpuConfig``,
``Mounts``, ``NetworkMount``, ``CreateClusterRequest``, ``ClusterCompute``), read 2026-09:

* pod: ``name``, ``image``, ``gpu: {id, count}``, ``cloud`` (``SECURE`` | ``COMMUNITY``; v2
  has no ``ALL``), ``disk`` (container disk in GB, ephemeral), ``ports`` (``"22/tcp"``
  strings), ``env`` (a string-to-string object), ``startSsh``, optional ``dataCenterIds``,
  ``args`` and ``mounts.network: [{volumeId, path}]``. The schema says
  ``unevaluatedProperties: false``: unknown keys are a 422, so nothing else is sent.
* cluster: the same container fields (no ``cloud``, no ``registry``) plus
  ``type`` (``TRAINING`` for olmx), ``compute: {gpuTypeId, gpuCountPerPod, podCount}``
  (``podCount`` 2..250).

Choices where sources differ or are silent:

* ``disk`` is optional in the schema, but a third-party client that tested against the live
  API notes that a body without it is rejected; olmx always sends it (default 100 GB, the
  container NVMe disk recommended in the research note, docs/research/cli-infra-plugins.md
  §4.3), and no network volume unless one is named.
* ``startSsh`` defaults to false in v2 (it was true in the SDK's GraphQL ``create_pod``).
  olmx reaches its pods over SSH, so it sends ``true`` and always exposes ``22/tcp``; the
  ``ssh.direct`` endpoint only exists when ``22/tcp`` is in ``ports``. SSH also needs public
  keys registered on the RunPod account (``PUT /v2/account/ssh-keys``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from olmx.errors import ConfigError

#: ``POST`` here creates a pod; ``GET`` lists them.
PODS_PATH = "/v2/pods"
#: ``POST`` here creates an instant cluster; ``GET`` lists them.
CLUSTERS_PATH = "/v2/clusters"
#: The port olmx needs on every pod: sshd, published so that ``ssh.direct`` exists.
SSH_PORT = "22/tcp"

#: RunPod pods expose TCP and HTTP ports only (no UDP).
_PORT_RE = re.compile(r"^[1-9][0-9]{0,4}/(tcp|http)$")
#: RunPod takes at most this many environment variables per pod.
MAX_ENV = 50
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CloudType(StrEnum):
    """RunPod cloud tier for a pod (v2 ``Cloud`` enum)."""

    SECURE = "SECURE"
    COMMUNITY = "COMMUNITY"


class ClusterType(StrEnum):
    """RunPod instant-cluster type (v2 ``ClusterType`` enum); olmx trains on ``TRAINING``."""

    TRAINING = "TRAINING"
    APPLICATION = "APPLICATION"
    SLURM = "SLURM"
    RAY = "RAY"


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What a pod and every node of an instant cluster share: the container and how it is
    reached (the fields of both v2 bodies, :func:`_container_fields`)."""

    name: str
    """Name shown in the RunPod console; also how an ambiguous create is recovered."""
    gpu_type_id: str
    """RunPod GPU type id, e.g. ``"NVIDIA H100 80GB HBM3"`` (``GET /v2/catalog/gpus``)."""
    image: str
    """Container image, pinned (e.g. a tag with torch, CUDA and a prebuilt flash-attn);
    clusters take no private-registry credential."""
    container_disk_gb: int = 100
    """Container disk in GB (of each node): local NVMe, wiped when the pod stops; data and
    checkpoints live here and are synced out explicitly."""
    network_volume_id: str | None = None
    """Attach this network volume (none by default: network volumes are slow for training)."""
    network_volume_path: str = "/runpod-volume"
    """Mount path of the network volume inside the container."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the container (a cluster's nodes also get NODE_RANK,
    MASTER_ADDR, ... from RunPod)."""
    ports: tuple[str, ...] = (SSH_PORT,)
    """Published ports as ``"port/protocol"``; ``22/tcp`` is added when missing."""
    data_center_ids: tuple[str, ...] = ()
    """Preferred data centres, in order; empty lets RunPod choose (a cluster always lands in one)."""
    args: str = ""
    """Arguments passed to the image's entrypoint (empty: the image's default)."""
    start_ssh: bool = True
    """Ask RunPod to install the account's SSH public keys into the container."""


@dataclass(frozen=True, kw_only=True)
class PodSpec(ContainerSpec):
    """One RunPod GPU pod, as olmx wants it."""

    gpu_count: int = 1
    """GPUs on the pod; 0 asks for a CPU pod (``cpu_flavor_id`` x ``vcpu_count``), which is
    cheap for checking that a run starts before renting GPUs."""
    min_cuda_version: str | None = None
    """Only place the pod on a host whose driver supports at least this CUDA version
    (``"13.0"``): the image's CUDA build needs it."""
    cpu_flavor_id: str = "cpu3c"
    """CPU pods: RunPod CPU flavor (``GET /v2/catalog/cpus``), e.g. ``cpu3c`` (compute-optimised)."""
    vcpu_count: int = 4
    """CPU pods: vCPUs; RunPod derives the memory from the flavor."""
    cloud_type: CloudType = CloudType.SECURE
    """``SECURE`` (RunPod data centres) or ``COMMUNITY``."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec(ContainerSpec):
    """One RunPod instant cluster: ``pod_count`` identical GPU pods on a private network."""

    pod_count: int = 2
    """Number of nodes, 2 to 250."""
    gpus_per_pod: int = 8
    """GPUs on each node."""
    cluster_type: ClusterType = ClusterType.TRAINING
    """RunPod cluster type."""


def build_pod_request(spec: PodSpec) -> dict[str, Any]:
    """The exact JSON body of ``POST /v2/pods`` for ``spec`` (validated first): a GPU pod, or a
    CPU pod when ``gpu_count`` is 0 (RunPod wants exactly one of ``gpu`` and ``cpu``)."""
    if spec.gpu_count:
        _check_positive("gpu_count", spec.gpu_count)
        compute: dict[str, Any] = {"gpu": {"id": spec.gpu_type_id, "count": spec.gpu_count}}
        if spec.min_cuda_version:
            if not re.fullmatch(r"\d+\.\d+", spec.min_cuda_version):
                raise ConfigError("min_cuda_version", f"must look like '12.8', got {spec.min_cuda_version!r}")
            compute["gpu"]["minCudaVersion"] = spec.min_cuda_version
    else:
        _check_positive("vcpu_count", spec.vcpu_count)
        if spec.vcpu_count < 2 or spec.vcpu_count & (spec.vcpu_count - 1):
            raise ConfigError(
                "vcpu_count", f"must be a power of two and at least 2 (RunPod's rule), got {spec.vcpu_count}"
            )
        if not spec.cpu_flavor_id.strip():
            raise ConfigError("cpu_flavor_id", "must not be empty")
        compute = {"cpu": {"id": spec.cpu_flavor_id, "vcpuCount": spec.vcpu_count}}
    _check_common(spec.name, spec.gpu_type_id if spec.gpu_count else "cpu", spec.image, spec.container_disk_gb)
    body: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        **compute,
        "cloud": CloudType(spec.cloud_type).value,
    }
    body.update(_container_fields(spec))
    return body


def build_cluster_request(spec: ClusterSpec) -> dict[str, Any]:
    """The exact JSON body of ``POST /v2/clusters`` for ``spec`` (validated first)."""
    if not 2 <= spec.pod_count <= 250:
        raise ConfigError("pod_count", f"must be between 2 and 250 (RunPod's limit), got {spec.pod_count}")
    _check_positive("gpus_per_pod", spec.gpus_per_pod)
    _check_common(spec.name, spec.gpu_type_id, spec.image, spec.container_disk_gb)
    body: dict[str, Any] = {
        "name": spec.name,
        "type": ClusterType(spec.cluster_type).value,
        "compute": {
            "gpuTypeId": spec.gpu_type_id,
            "gpuCountPerPod": spec.gpus_per_pod,
            "podCount": spec.pod_count,
        },
        "image": spec.image,
    }
    body.update(_container_fields(spec))
    return body


def _container_fields(spec: ContainerSpec) -> dict[str, Any]:
    """Fields shared by pod and cluster bodies, in a fixed order."""
    ports = list(spec.ports)
    for port in ports:
        if not _PORT_RE.match(port):
            raise ConfigError("ports", f"{port!r} is not 'PORT/tcp' or 'PORT/http' (RunPod pods have no UDP)")
    if SSH_PORT not in ports:
        ports.insert(0, SSH_PORT)
    if len(spec.env) > MAX_ENV:
        raise ConfigError("env", f"{len(spec.env)} environment variables; RunPod takes at most {MAX_ENV} per pod")
    for name, value in spec.env.items():
        if not _ENV_NAME_RE.match(str(name)):
            raise ConfigError("env", f"{name!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise ConfigError("env", f"{name} must be a string, got {type(value).__name__}")
    out: dict[str, Any] = {
        "disk": spec.container_disk_gb,
        "ports": ports,
        "env": dict(spec.env),
        "startSsh": spec.start_ssh,
    }
    if spec.args:
        out["args"] = spec.args
    if spec.data_center_ids:
        out["dataCenterIds"] = list(spec.data_center_ids)
    if spec.network_volume_id:
        if not spec.network_volume_path.startswith("/"):
            raise ConfigError("network_volume_path", f"must be absolute, got {spec.network_volume_path!r}")
        out["mounts"] = {"network": [{"volumeId": spec.network_volume_id, "path": spec.network_volume_path}]}
    return out


def _check_common(name: str, gpu_type_id: str, image: str, disk: int) -> None:
    for field_name, value in (("name", name), ("gpu_type_id", gpu_type_id), ("image", image)):
        if not value or not value.strip():
            raise ConfigError(field_name, "must not be empty")
    _check_positive("container_disk_gb", disk)


def _check_positive(field_name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(field_name, f"must be a positive integer, got {value!r}")
