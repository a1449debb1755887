"""This host's processes, read from ``/proc`` (Linux; elsewhere ``kill(pid, 0)`` only): whether a
process still runs and is the one recorded (its start time), which processes carry an
environment variable, the boot id and pid namespace that tell another boot or container apart.
What the run directory's lock asks to tell a live holder from a stale one; torch-free."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["process_start", "process_state", "process_alive", "processes_with_env", "boot_id", "pid_namespace"]


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (state is [0], start time [19])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R`` running, ``S`` sleeping, ``D`` in
    uninterruptible sleep, ``T`` stopped, ...; None: gone or unknown)."""
    fields = _proc_stat(pid)
    return fields[0] if fields else None


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks after boot (None: unknown), which tells a
    reused pid apart from the process recorded with it."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This host's boot id (None: unknown): a process recorded before a reboot is gone."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's pid namespace (None: unknown): a container with the same host name is another host."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` of this host runs (not a zombie) and, when ``start`` (its start
    time in clock ticks after boot, ``/proc/PID/stat``) is given, is still the same process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    fields = _proc_stat(pid)
    if fields is None:
        return sys.platform != "linux"  # no /proc: trust kill(pid, 0)
    if fields[0] in ("Z", "X"):
        return False
    return start is None or int(fields[19]) == start


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of this host's processes (readable by this user) whose environment has ``name=value``."""
    want = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if want in env.split(b"\0") and process_alive(pid):
            found.append(pid)
    return sorted(found)
