"""GPU models' tables, a leaf: compute capability, memory and dense peak FLOP/s by model name
(NVIDIA's data sheets), for machines olmx cannot query from here and for the plan's time model.
:mod:`olmx.launch.devices` re-exports them for infra plugins; the core imports them from here."""

from __future__ import annotations

import re

__all__ = ["gpu_compute_capability", "gpu_memory_gib", "PEAK_FLOPS", "peak_flops"]


#: CUDA compute capability by GPU model, for machines olmx cannot query from here (Slurm
#: nodes, RunPod pods): the first key found in the name wins, so longer keys come first.
#: Source: NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus).
_CAPABILITIES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("GB200", (10, 0)),
    ("B200", (10, 0)),
    ("B300", (10, 3)),
    ("RTX PRO 6000", (12, 0)),
    ("RTX 5090", (12, 0)),
    ("GH200", (9, 0)),
    ("H200", (9, 0)),
    ("H100", (9, 0)),
    ("L40", (8, 9)),
    ("L4", (8, 9)),
    ("RTX 6000 Ada", (8, 9)),
    ("RTX 4090", (8, 9)),
    ("A100", (8, 0)),
    ("A800", (8, 0)),
    ("A30", (8, 0)),
    ("A6000", (8, 6)),
    ("A40", (8, 6)),
    ("A5000", (8, 6)),
    ("A4000", (8, 6)),
    ("RTX 3090", (8, 6)),
    ("A10", (8, 6)),
    ("V100", (7, 0)),
)


def gpu_compute_capability(name: str) -> tuple[int, int] | None:
    """Compute capability of a GPU model named like ``nvidia-smi`` or RunPod name it
    (``"NVIDIA H100 80GB HBM3"``); None when the model is not in the table."""
    upper = name.upper()
    for key, capability in _CAPABILITIES:
        if key.upper() in upper:
            return capability
    return None


#: Memory of GPU models whose names do not say it (GiB, about what ``nvidia-smi`` reports);
#: a size in the name (``80GB``) wins. Longer keys first. Source: NVIDIA's data sheets.
_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("GB200", 186.0),
    ("B300", 279.0),
    ("B200", 179.0),
    ("GH200", 95.0),
    ("H200", 140.0),
    ("H100", 79.6),
    ("RTX PRO 6000", 95.0),
    ("RTX 5090", 31.5),
    ("RTX 6000 Ada", 47.5),
    ("RTX 4090", 23.6),
    ("RTX 3090", 23.6),
    ("L40", 44.5),
    ("L4", 22.0),
    ("A6000", 47.5),
    ("A40", 44.5),
    ("A10", 22.0),
)


def gpu_memory_gib(name: str) -> float | None:
    """Memory of one GPU of the model named like ``nvidia-smi`` or RunPod name it; None when
    unknown (an A100 or a V100 without its size in the name)."""
    sized = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    if sized:
        return float(sized.group(1)) * 0.995
    for key, gib in _MEMORY_GIB:  # whole words: "A10" is not the A100
        if re.search(rf"(?<![A-Z0-9]){re.escape(key)}(?![0-9])", name, re.IGNORECASE):
            return gib
    return None


#: Dense peak FLOP/s of one GPU by compute dtype, by name fragment (first match wins, so
#: longer names first): ``bfloat16`` (16-bit tensor cores), ``float32`` (CUDA cores: PyTorch
#: does not use TF32 for float32 matmuls unless asked), ``float8`` (8-bit tensor cores; None
#: where the GPU has none). Source: NVIDIA's data sheets (dense, i.e. half the "with sparsity"
#: figures); OLMo-core's ``SpeedMonitorCallback`` uses the same bfloat16 numbers.
PEAK_FLOPS: tuple[tuple[str, dict[str, float | None]], ...] = (
    ("GB200", {"bfloat16": 2.5e15, "float32": 80e12, "float8": 5.0e15}),
    ("B300", {"bfloat16": 2.25e15, "float32": 75e12, "float8": 4.5e15}),
    ("B200", {"bfloat16": 2.25e15, "float32": 75e12, "float8": 4.5e15}),
    ("H100 PCIe", {"bfloat16": 756e12, "float32": 51e12, "float8": 1513e12}),
    ("H100 NVL", {"bfloat16": 835e12, "float32": 60e12, "float8": 1671e12}),
    ("GH200", {"bfloat16": 989e12, "float32": 67e12, "float8": 1979e12}),
    ("H200", {"bfloat16": 989e12, "float32": 67e12, "float8": 1979e12}),
    ("H100", {"bfloat16": 989e12, "float32": 67e12, "float8": 1979e12}),
    ("A100", {"bfloat16": 312e12, "float32": 19.5e12, "float8": None}),
    ("L40S", {"bfloat16": 362e12, "float32": 91.6e12, "float8": 733e12}),
    ("A10G", {"bfloat16": 70e12, "float32": 31.2e12, "float8": None}),
    ("L4", {"bfloat16": 121e12, "float32": 30.3e12, "float8": 242e12}),
)


def peak_flops(name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of one device named like ``nvidia-smi`` names it, for compute in
    ``dtype`` (``bfloat16``/``float16``, ``float32``, ``float8``); None where unknown (CPUs:
    there is no vendor figure to use, and the achievable rate depends on the vector units)."""
    kind = "bfloat16" if dtype == "float16" else dtype
    for fragment, peaks in PEAK_FLOPS:
        if fragment in name:
            return peaks.get(kind)
    return None
