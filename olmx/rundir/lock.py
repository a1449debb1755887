"""The run directory's lock: one writer per run directory.

``olmx train`` takes :meth:`olmx.rundir.RunDir.acquire` before it
writes anything (``plan.yaml`` included) and releases it when the launch returns. The lock is a
file created with ``O_CREAT | O_EXCL``, which is atomic on local file systems and on the shared
ones multi-node runs use (NFSv3 and later, Lustre, GPFS, BeeGFS, CephFS); it holds the
holder's host, pid, process start time, boot id and pid namespace, and a token that the
launcher puts into the environment of everything it starts (:data:`LOCK_ENV`). A lock is
*stale* only when it was taken on this host (same host name, boot and pid namespace), its
launcher is gone (or its pid now belongs to another process) and no process of this host
carries its token (torchrun and workers still saving a checkpoint keep it held). A stale lock
is taken over under a second ``O_EXCL`` file (``.olmx-lock.takeover``), so of two launchers
that find the same stale lock only one takes it. A lock taken on another host cannot be
probed from here: olmx refuses and says how to remove it.

On Slurm and RunPod the batch job or the pod is what trains, and it outlives its launcher by
design: the lock is held while ``olmx train`` submits and follows the run; a detached Slurm job
(``infra.detach=true``) is not covered by it once ``olmx train`` has returned (``launch.json``
and ``olmx jobs status|cancel RUN_DIR`` reach it).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from olmx.errors import ConfigError
from olmx.rundir.processes import boot_id, pid_namespace, process_alive, process_start, processes_with_env

__all__ = ["LOCK_ENV", "TAKEOVER_SUFFIX", "Holder", "RunLock", "acquire", "read_holder"]

#: Environment variable carrying the run-directory lock's token into every process a launcher
#: starts (torchrun, its workers): while one of them lives, the lock is held.
LOCK_ENV = "OLMX_RUN_LOCK"
#: The second ``O_EXCL`` file beside the lock, held while a stale lock is taken over.
TAKEOVER_SUFFIX = ".takeover"


def _create_exclusive(path: Path, holder: Holder) -> bool:
    """Create ``path`` with ``O_CREAT | O_EXCL`` holding ``holder``; False if it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(holder)) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def _busy_hint(path: Path) -> str:
    return (
        f"Wait for it to end, follow it (olmx jobs status {path}) or stop it (olmx jobs cancel {path}); "
        f"a second writer would interleave metrics.jsonl and overwrite the same checkpoints"
    )


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run directory's lock: what ``.olmx-lock`` records."""

    #: Host name of the launcher.
    host: str
    #: Its pid there.
    pid: int
    #: When it took the lock (local time, ISO 8601).
    started: str
    #: Random token, also in :data:`LOCK_ENV` of every process the launcher started.
    token: str
    #: The command that took it.
    command: str = "olmx train"
    #: The launcher's start time in clock ticks after boot (tells a reused pid apart).
    pid_start: int | None = None
    #: The host's boot id (a lock from before a reboot is stale).
    boot_id: str | None = None
    #: The launcher's pid namespace (a container with the same host name is another host).
    pid_ns: str | None = None

    @classmethod
    def current(cls, command: str = "olmx train") -> Holder:
        """This process."""
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            token=uuid.uuid4().hex,
            command=command,
            pid_start=process_start(os.getpid()),
            boot_id=boot_id(),
            pid_ns=pid_namespace(),
        )

    def describe(self) -> str:
        """'olmx train (pid 123 on host h, started 2026-12-01T19:50:01+0000)'."""
        return f"{self.command} (pid {self.pid} on host {self.host}, started {self.started})"

    def on_this_host(self) -> bool:
        """Same host name and pid namespace (where they are known)."""
        if self.host != socket.gethostname():
            return False
        ns = pid_namespace()
        return self.pid_ns is None or ns is None or self.pid_ns == ns

    @property
    def unreadable(self) -> bool:
        """An unreadable lock file (left empty or torn, or not text at all), not a holder."""
        return self.host == "?"

    def state(self) -> str:
        """``alive`` (the launcher or a process it started runs), ``dead`` (none does), or
        ``unknown`` (another host: its processes cannot be seen from here)."""
        if self.unreadable:  # its writer died before it wrote it, or something else wrote it
            return "dead"
        if not self.on_this_host():
            return "unknown"
        boot = boot_id()
        if self.boot_id and boot and self.boot_id != boot:
            return "dead"  # the host restarted since
        if process_alive(self.pid, self.pid_start) or processes_with_env(LOCK_ENV, self.token):
            return "alive"
        return "dead"


def _parse_holder(raw: bytes) -> Holder | None:
    """The holder ``raw`` records; :func:`_unreadable` where it is no text (olmx writes ASCII
    JSON, so no write in progress looks like that); None where it is no holder (yet)."""
    try:
        data = json.loads(raw.decode())
    except UnicodeDecodeError:
        return _unreadable(raw)
    except ValueError:
        return None
    try:
        return Holder(**data)
    except TypeError:
        return None


def _unreadable(raw: bytes) -> Holder:
    """The stand-in holder of a lock file that records none (:attr:`Holder.unreadable`); its
    token is the file's content, so a takeover removes that file only."""
    return Holder(host="?", pid=0, started="?", token=f"torn-{raw!r}", command="(unreadable lock)")


def read_holder(path: Path) -> Holder | None:
    """The holder a lock file records (None: no file, or one being written; a file that is
    no text: :attr:`Holder.unreadable`)."""
    try:
        return _parse_holder(path.read_bytes())
    except OSError:
        return None


@dataclass
class RunLock:
    """A held run-directory lock (:meth:`RunDir.acquire`); release it when the launch ends."""

    path: Path
    holder: Holder
    #: The holder of the stale lock this one replaced, if any.
    took_over: Holder | None = None

    def release(self) -> None:
        """Remove the lock if it is still this one's (idempotent)."""
        current = read_holder(self.path)
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        if os.environ.get(LOCK_ENV) == self.holder.token:
            del os.environ[LOCK_ENV]

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(folder: Path, lock_file: Path, *, field: str, command: str) -> RunLock:
    """Take the lock ``lock_file`` of the run directory ``folder`` (which exists), or raise
    :class:`ConfigError` naming ``field`` and the holder. A stale lock (see the module
    documentation) is taken over; the returned lock says whose (:attr:`RunLock.took_over`).
    Puts the token into ``os.environ[LOCK_ENV]``, so that every process started from here holds
    the lock too."""
    me = Holder.current(command)
    took_over: Holder | None = None
    for _ in range(5):
        if _create_exclusive(lock_file, me):
            os.environ[LOCK_ENV] = me.token
            return RunLock(lock_file, me, took_over)
        held = _wait_readable(lock_file)
        if held is None:  # vanished: its holder released it; try again
            continue
        state = held.state()
        if state == "alive":
            who = held.describe()
            if not process_alive(held.pid, held.pid_start):
                pids = ", ".join(map(str, processes_with_env(LOCK_ENV, held.token)))
                who += f", which is gone; processes it started still run (pids {pids}: stopping after a checkpoint)"
            raise ConfigError(field, f"'{folder}' is in use by {who}. {_busy_hint(folder)}")
        if state == "unknown":
            raise ConfigError(
                field,
                f"'{folder}' is locked by {held.describe()}, on another host (olmx cannot see its "
                f"processes from {me.host}). If no olmx train of this run is running there, remove "
                f"{lock_file} and run again",
            )
        _take_over(folder, lock_file, held, me, field)
        took_over = held
    raise ConfigError(field, f"'{folder}': could not take {lock_file}; other launchers keep taking it")


def _wait_readable(lock_file: Path, timeout: float = 2.0) -> Holder | None:
    """The holder of an existing lock file; a file being written is waited for, one left
    empty or torn (its writer died at once) counts as a holder that is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            raw = lock_file.read_bytes()
        except FileNotFoundError:
            return None
        holder = _parse_holder(raw)
        if holder is not None:
            return holder
        if time.monotonic() > deadline:
            return _unreadable(raw)
        time.sleep(0.05)


def _take_over(folder: Path, lock_file: Path, stale: Holder, me: Holder, field: str) -> None:
    """Remove ``stale``'s lock, holding ``.olmx-lock.takeover`` meanwhile (O_EXCL too): of
    launchers that found the same stale lock, one removes it and creates its own; the others
    then find that one's lock alive."""
    mutex = lock_file.with_name(lock_file.name + TAKEOVER_SUFFIX)
    if not _create_exclusive(mutex, me):
        other = read_holder(mutex)
        try:
            old = time.time() - mutex.stat().st_mtime > 60
        except FileNotFoundError:
            return  # just released: look again
        if old or (other is not None and other.state() == "dead"):  # its taker died in the middle
            mutex.unlink(missing_ok=True)
            return
        if other is None:  # being written this instant
            time.sleep(0.1)
            return
        raise ConfigError(field, f"'{folder}' is being taken over by {other.describe()}. {_busy_hint(folder)}")
    try:
        current = read_holder(lock_file)
        if current is None or current.token == stale.token:
            lock_file.unlink(missing_ok=True)
    finally:
        mutex.unlink(missing_ok=True)
