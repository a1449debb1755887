"""What olmx asks RunPod to create: the pod or instant-cluster specs (each GPU type in each
data centre, in the order tried until RunPod has capacity), their request bodies checked before
anything is sent, and the pods' environment (``env``, RunPod secret references, ``pass_env``).
Torch-free and without network: the plan, ``--dry-run`` and the launch share it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError
from olmx_plugins.infra.runpod.config import RunPodConfig

#: Spec field -> config key, for errors raised while building a request body.
SPEC_KEYS = {
    "gpu_count": "gpus_per_node",
    "gpus_per_pod": "gpus_per_node",
    "pod_count": "nodes",
    "gpu_type_id": "gpu_type",
    "cpu_flavor_id": "cpu_flavor",
    "vcpu_count": "vcpus",
}


def spec_for(
    cfg: RunPodConfig,
    *,
    name: str,
    env: dict[str, str],
    gpu_type: str | None = None,
    data_center: str | None = None,
) -> Any:
    """What to ask RunPod for: a :class:`PodSpec`, or a :class:`ClusterSpec` for several
    nodes; ``gpu_type`` and ``data_center`` pick one candidate (default: the first GPU
    type, and ``data_centers`` as a whole)."""
    from olmx_plugins.infra.runpod import spec

    common: dict[str, Any] = dict(
        name=name,
        image=cfg.image,
        container_disk_gb=cfg.container_disk_gb,
        network_volume_id=cfg.network_volume_id,
        env=env,
        data_center_ids=(data_center,) if data_center else tuple(cfg.data_centers),
    )
    gpu_type = gpu_type or cfg.gpu_type
    if cfg.nodes > 1:
        return spec.ClusterSpec(gpu_type_id=gpu_type, pod_count=cfg.nodes, gpus_per_pod=cfg.gpus(), **common)
    return spec.PodSpec(
        gpu_type_id=gpu_type,
        gpu_count=cfg.gpus(),
        min_cuda_version=cfg.min_cuda_version,
        cpu_flavor_id=cfg.cpu_flavor,
        vcpu_count=cfg.vcpus,
        cloud_type=spec.CloudType(cfg.cloud),
        **common,
    )


def candidates(cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> list[tuple[str, Any]]:
    """``(label, spec)`` of every create olmx tries, in order, until RunPod has capacity:
    each GPU type (``gpu_type``, then ``gpu_types``) in each data centre of
    ``data_centers`` (or wherever RunPod chooses). Each request body is checked here; a
    setting RunPod would refuse is a ConfigError naming its ``infra.`` key."""
    gpu_types = cfg.gpu_candidates() if cfg.gpus() else [cfg.gpu_type]
    centres: list[str | None] = list(dict.fromkeys(cfg.data_centers)) or [None]
    out = []
    for gpu_type in gpu_types:
        for centre in centres:
            wanted = spec_for(cfg, name=name, env=env, gpu_type=gpu_type, data_center=centre)
            request_body(wanted)
            what = f"{cfg.gpus()} x {gpu_type}" if cfg.gpus() else f"CPU {cfg.cpu_flavor} x {cfg.vcpus} vCPUs"
            out.append((f"{what} in {centre or 'any data centre'}", wanted))
    return out


def request(cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """``(path, body)`` of the first create request: ``POST /v2/pods`` or ``POST /v2/clusters``;
    a setting RunPod would refuse is a ConfigError naming its ``infra.`` key."""
    return request_body(candidates(cfg, name=name, env=env)[0][1])


def request_body(wanted: Any) -> tuple[str, dict[str, Any]]:
    from olmx_plugins.infra.runpod import spec

    try:
        if isinstance(wanted, spec.ClusterSpec):
            return spec.CLUSTERS_PATH, spec.build_cluster_request(wanted)
        return spec.PODS_PATH, spec.build_pod_request(wanted)
    except ConfigError as exc:
        key = f"infra.{SPEC_KEYS.get(exc.field, exc.field)}"
        raise ConfigError(key, str(exc).removeprefix(f"{exc.field}: ")) from None


def pod_env(cfg: RunPodConfig, *, values: bool = True) -> dict[str, str]:
    """The pod's environment: ``env``, the RunPod secret references of ``secrets``, and
    the values of ``pass_env`` from this environment (with ``values=False``, a redacted
    placeholder for each: what the plan and the dry run show)."""
    refs = {name: f"{{{{ RUNPOD_SECRET_{secret} }}}}" for name, secret in cfg.secrets.items()}
    if not values:
        shown = {k: f"<redacted: ${k} of the launching environment>" for k in cfg.pass_env}
        return {**cfg.env, **refs, **shown}
    missing = [k for k in cfg.pass_env if k not in os.environ]
    if missing:
        raise ConfigError("infra.pass_env", f"{', '.join(missing)} not set in this environment")
    return {**cfg.env, **refs, **{k: os.environ[k] for k in cfg.pass_env}}


def stored_env_note(cfg: RunPodConfig) -> str:
    """Which variables RunPod stores in plain text with the pod ('' when none are secret)."""
    if not cfg.pass_env:
        return ""
    return (
        f"RunPod stores the pod's environment and returns it on every GET of the pod: the values of "
        f"{', '.join(cfg.pass_env)} (infra.pass_env) are kept there in plain text. For tokens, prefer "
        "RunPod secrets (infra.secrets.NAME=<secret name>), which only the pod sees"
    )


def pod_name(cfg: RunPodConfig, plan: Any) -> str:
    return cfg.pod_name or f"olmx-{Path(plan.run_dir).name}"


def describe(cfg: RunPodConfig) -> str:
    """What one node is, in words ('2 x 8 NVIDIA H100 80GB HBM3', 'CPU cpu3c x 4 vCPUs')."""
    if not cfg.gpus():
        return f"CPU {cfg.cpu_flavor} x {cfg.vcpus} vCPUs"
    return f"{cfg.nodes} x {cfg.gpus()} {cfg.gpu_type}"
