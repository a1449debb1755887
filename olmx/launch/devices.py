"""What accelerators this machine has, found without importing torch (``nvidia-smi``)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class LocalDevices:
    """The local machine's accelerators."""

    #: ``cuda`` or ``cpu``.
    kind: str
    count: int
    name: str
    compute_capability: tuple[int, int] | None


@lru_cache(maxsize=1)
def local_devices() -> LocalDevices:
    """CUDA GPUs visible through ``nvidia-smi``; CPU when there are none."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        if rows:
            name, cap = rows[0][0], rows[0][1] if len(rows[0]) > 1 else ""
            major, _, minor = cap.partition(".")
            cc = (int(major), int(minor or 0)) if major.isdigit() else None
            return LocalDevices("cuda", len(rows), name, cc)
    return LocalDevices("cpu", 0, "cpu", None)
