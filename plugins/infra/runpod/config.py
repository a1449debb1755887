"""The settings of ``infra=runpod`` (:class:`RunPodConfig`, its Hydra schema) and their defaults.

Torch-free and light to import: the registry loads it with the plugin to compose a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from olmx.api import setting
from olmx.launch import TorchrunConfig

#: RunPod's PyTorch image with torch 2.13.0 (the newest in olmx's range). Why this tag: it is the CUDA 13.0
#: build of RunPod's 1.2.0 image line (runpod/containers, official-templates/pytorch), and
#: CUDA 13 + torch 2.13 is the combination FlashAttention publishes a prebuilt wheel for
#: (see DEFAULT_FLASH_ATTN_WHEEL), so nothing is compiled in the pod; Ubuntu 24.04 gives
#: Python 3.12, the wheel's ABI. CUDA 13 builds also run on Blackwell GPUs. Such a pod needs a
#: host whose driver supports CUDA 13, hence the default ``min_cuda_version``.
DEFAULT_IMAGE = "runpod/pytorch:1.2.0-cu1300-torch2130-ubuntu2404"
#: FlashAttention's prebuilt wheel for CUDA 13 / torch 2.13 (its setup.py names release
#: assets this way); ``{python_tag}`` is filled on the pod (``cp312``).
DEFAULT_FLASH_ATTN_WHEEL = (
    "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3.post1/"
    "flash_attn-2.8.3.post1+cu13torch2.13cxx11abiTRUE-{python_tag}-{python_tag}-linux_x86_64.whl"
)


#: GPUs per node of a RunPod instant cluster (RunPod lists cluster nodes with 8).
CLUSTER_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class RunPodConfig(TorchrunConfig):
    """Settings of ``infra=runpod``."""

    #: RunPod GPU type id (``NVIDIA H100 80GB HBM3``, ``NVIDIA B200``, ...): the first one
    #: asked for, and the GPU the plan is made for.
    gpu_type: str = "NVIDIA H100 80GB HBM3"
    #: GPU types asked for next, in order, while RunPod has no capacity for the one before
    #: (each with the same compute capability as ``gpu_type``, which the plan checked).
    gpu_types: list[str] = field(default_factory=list)
    #: GPUs per pod; 0 makes a CPU pod (``cpu_flavor``, ``vcpus``): a cheap check that a run
    #: starts. Null: 1 for one pod, 8 for a cluster (RunPod's instant-cluster nodes have 8).
    gpus_per_node: Optional[int] = setting(None, ge=0, integer=True)
    #: Worker processes per pod; null means one per GPU, or 2 on a CPU pod.
    nproc_per_node: Optional[int] = setting(None, ge=1, integer=True)
    #: Pods; more than one makes a RunPod instant cluster (GPU pods on a private network).
    nodes: int = setting(1, ge=1)
    #: CPU pods: RunPod CPU flavor.
    cpu_flavor: str = "cpu3c"
    #: CPU pods: vCPUs.
    vcpus: int = setting(4, ge=2)
    #: Container image; it must bring a torch in olmx's supported range (the bootstrap checks it).
    image: str = DEFAULT_IMAGE
    #: Only hosts whose driver supports at least this CUDA version (the image's build needs it).
    min_cuda_version: Optional[str] = "13.0"
    #: Prebuilt flash-attn wheel installed on the pod (``{python_tag}`` is filled in there);
    #: null: none. Never built from source.
    flash_attn_wheel: Optional[str] = DEFAULT_FLASH_ATTN_WHEEL
    #: Container disk in GB: local NVMe holding the run (wiped when the pod stops).
    container_disk_gb: int = setting(100, ge=1)
    #: Attach this network volume at /runpod-volume (none by default: too slow to train from).
    network_volume_id: Optional[str] = None
    #: ``SECURE`` or ``COMMUNITY`` cloud (single pods).
    cloud: str = "SECURE"
    #: Data centres tried one after the other (for each GPU type), while RunPod has no
    #: capacity in the one before; empty lets RunPod choose.
    data_centers: list[str] = field(default_factory=list)
    #: Environment of the pod. Saved in the plan: no secrets here (see ``secrets``).
    env: dict[str, str] = field(default_factory=dict)
    #: Pod variables set from RunPod secrets, ``NAME: secret_name``: the pod's environment
    #: gets ``{{ RUNPOD_SECRET_secret_name }}``, which RunPod fills in inside the pod, so the
    #: value never leaves RunPod. The recommended way to give a pod a token.
    secrets: dict[str, str] = field(default_factory=dict)
    #: Names of variables whose values are taken from this machine's environment at launch and
    #: set in the pod's environment. olmx never saves or prints them, but RunPod stores a
    #: pod's environment and returns it on every GET of the pod: prefer ``secrets``.
    pass_env: list[str] = field(default_factory=list)
    #: Pod (or cluster) name; null: ``olmx-<run dir name>``.
    pod_name: Optional[str] = None
    #: Train on this existing pod instead of creating one (started if it is stopped).
    pod_id: Optional[str] = None
    #: Train on this existing instant cluster (``nodes`` > 1).
    cluster_id: Optional[str] = None
    #: Leave the pod running when the run ends (else it is stopped; a cluster is terminated).
    keep: bool = False
    #: Directory on the pod's container disk that holds the run.
    workdir: str = "/workspace/olmx"
    #: Python on the pod (the image's, which has torch).
    python: str = "python"
    #: Install olmx on the pod from the shipped source with pinned dependencies; false for an
    #: image that already has this olmx.
    install: bool = True
    #: Copy the run's data files (``data=text``/``numpy``: the files ``data.paths`` names
    #: here) to every pod, under ``<workdir>/data/`` (outside the run directory, so they are not
    #: copied back), and train on the copies; false:
    #: ``data.paths`` already name files on the pods (in the image or on a network volume).
    ship_data: bool = True
    #: Refuse to ship more than this many GB of data files (copying goes through SSH with the
    #: run); put larger data on a network volume or in the image and set ``ship_data=false``.
    ship_data_max_gb: float = setting(1.0, ge=0)
    #: SSH private key for the pods (``ssh -i``); null: ssh's defaults and agent. Its public
    #: key must be registered with RunPod (checked before a pod is created).
    ssh_key: Optional[str] = None
    #: Seconds to wait for the pods to run with SSH before giving up (and terminating them).
    wait_timeout: float = setting(1200.0, gt=0)
    #: Seconds to wait, once a pod runs with its SSH port published, until its sshd answers
    #: (it can still be starting); after that the pods olmx created are terminated.
    ssh_wait_timeout: float = setting(300.0, gt=0)
    #: Seconds between two looks at the pods (API while starting, SSH while training).
    poll_seconds: float = setting(10.0, gt=0)

    def gpus(self) -> int:
        """GPUs per pod: ``gpus_per_node``, or its default (1 for one pod, 8 for a cluster)."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return CLUSTER_GPUS_PER_NODE if self.nodes > 1 else 1

    def gpu_candidates(self) -> list[str]:
        """The GPU types asked for, in order (``gpu_type``, then ``gpu_types``), each once."""
        return list(dict.fromkeys([self.gpu_type, *self.gpu_types]))
