"""What accelerators this machine has, found without importing torch (``nvidia-smi``)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Re-exported for infra plugins (the public surface); the tables live in olmx.hardware.
from olmx.hardware import PEAK_FLOPS as PEAK_FLOPS
from olmx.hardware import gpu_compute_capability as gpu_compute_capability
from olmx.hardware import gpu_memory_gib as gpu_memory_gib
from olmx.hardware import peak_flops as peak_flops

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "LocalDevices",
    "local_devices",
    "gpu_compute_capability",
    "gpu_memory_gib",
    "host_memory_gib",
    "PEAK_FLOPS",
    "peak_flops",
]


@dataclass(frozen=True)
class LocalDevices:
    """The local machine's accelerators."""

    #: ``cuda`` or ``cpu``.
    kind: str
    count: int
    name: str
    compute_capability: tuple[int, int] | None
    #: Memory of one GPU (``nvidia-smi``'s ``memory.total``); None on CPU.
    memory_gib: float | None = None


@lru_cache(maxsize=1)
def local_devices() -> LocalDevices:
    """CUDA GPUs visible through ``nvidia-smi``; CPU when there are none."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run(
                [exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        if rows:
            name, cap = rows[0][0], rows[0][1] if len(rows[0]) > 1 else ""
            major, _, minor = cap.partition(".")
            cc = (int(major), int(minor or 0)) if major.isdigit() else None
            mib = rows[0][2] if len(rows[0]) > 2 else ""
            memory = int(mib) / 1024 if mib.isdigit() else gpu_memory_gib(name)
            return LocalDevices("cuda", len(rows), name, cc, memory)
    return LocalDevices("cpu", 0, "cpu", None)


def host_memory_gib() -> float | None:
    """This machine's RAM (``MemTotal`` of ``/proc/meminfo``); None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None
