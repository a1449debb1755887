"""Running a plan on RunPod pods over SSH: ship, start, watch, fetch, stop the training.

Everything here is plain ``ssh`` (OpenSSH's client) plus ``tar`` on both ends; no rsync or
scp is needed in the image. Each step is one ssh command:

* **ship**: a gzipped tar made in memory (``plan.yaml`` with the pod's run directory,
  ``bootstrap.sh``, ``constraints.txt``, the olmx source, and the checkpoint a resumed run
  starts from) is piped into ``mkdir -p W && tar -xzf - -C W``.
* **start**: ``nohup setsid bash bootstrap.sh &``: training outlives the ssh session (a
  dropped connection or Ctrl-C on the laptop does not kill it).
* **watch**: a small shell probe prints the bytes of ``metrics.jsonl`` and of the node's log
  added since the last look, and the bootstrap's exit status once written;
  olmx appends them to the local run directory, so the progress bar and the failure tail work
  exactly as for a local run.
* **fetch**: ``tar -cf - .`` of the pod's run directory (checkpoints, metrics, summary, logs),
  unpacked into the local run directory with tarfile's ``data`` filter; node 0 last, so that
  its files win; on several nodes the checkpoint shards of every node end up side by side.
  :func:`localize_summary` then names the local run directory in the copied ``summary.json``.
* **kill**: SIGTERM to the bootstrap's process group; :func:`wait_ended` then waits until the
  bootstrap has ended.

* **wait for SSH** (:func:`wait_for_ssh`): a pod that RunPod reports running with its port
  published may still be starting sshd; olmx retries ``ssh ... true`` until it answers.

Host keys: pods are new hosts, and RunPod reuses IP:port pairs across pods, so olmx accepts
a pod's key on first use into a known-hosts file of the launch
(``RUN_DIR/.ssh/known_hosts-<launch id>``) instead of the user's ``~/.ssh/known_hosts``: a
resumed run on a new pod at a recycled IP:port starts a new file rather than failing with
"host key changed". Authentication is the user's SSH key, which RunPod installs into the pod
(``startSsh``) from the account's registered public keys.
"""

from __future__ import annotations

import gzip
import io
import json
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmx.errors import LaunchError
from olmx.rundir import RunDir

#: Directories and files of an olmx checkout that make up its source distribution.
SOURCE_PARTS = ("olmx", "plugins", "conf", "templates", "pyproject.toml", "setup.py", "README.md")

#: Shell function: is the process in pid file $1 alive? A zombie is not (PID 1 of a container
#: often reaps no orphans, and the bootstrap is one once its ssh session has ended).
_ALIVE = """alive() {{ local p s; p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] || return 1
  s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1); [ -n "$s" ] && [ "$s" != Z ]; }}"""

#: Chunks larger than this are fetched over several looks.
_CHUNK = 1 << 20

#: One look at node RANK from WORK, given the local offsets MO, LO of metrics and log: a
#: header line ``<metrics size> <metrics offset> <n> <log size> <log offset> <m> <exit> <alive>``
#: (``exit`` is ``-`` while there is none), then exactly n bytes of metrics and m bytes of log
#: from those offsets. Read in this order: ``alive``, then ``exit`` (a bootstrap that ends
#: between the two is not taken for one that died without a status), then the files (complete
#: once ``exit`` exists, since the bootstrap writes it last). An offset past the end (the file
#: was truncated) restarts at 0. Shell and coreutils only, so it works whatever state the pod's Python is in.
_PROBE = """cd {work} || exit 1
look() {{ local size off n; size=$(stat -c %s "$1" 2>/dev/null || echo 0); off=$2
  [ "$off" -le "$size" ] || off=0; n=$((size - off)); [ "$n" -le {chunk} ] || n={chunk}; echo "$size $off $n"; }}
{alive}
alive status/pid.node{rank} && alive=1 || alive=0
ex=$(cat status/exit.node{rank} 2>/dev/null || echo -)
m=$(look run/metrics.jsonl {mo}); l=$(look run/logs/node{rank}.log {lo})
echo "$m $l $ex $alive"; set -- $m $l
tail -c +$(($2 + 1)) run/metrics.jsonl 2>/dev/null | head -c "$3"
tail -c +$(($5 + 1)) run/logs/node{rank}.log 2>/dev/null | head -c "$6"
"""


@dataclass(frozen=True)
class Remote:
    """One pod reached with ``ssh``."""

    host: str
    """Public IP of the pod."""
    port: int
    """Public port mapped to the pod's sshd."""
    user: str = "root"
    """Login user."""
    key_file: str | None = None
    """Private key (``ssh -i``); None: ssh's defaults and agent."""
    known_hosts: str | None = None
    """Known-hosts file for the pod's host key."""

    def ssh(self, command: str) -> list[str]:
        """The ssh argv that runs ``command`` (one shell line) on the pod."""
        argv = [
            "ssh",
            "-p",
            str(self.port),
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=20",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "StrictHostKeyChecking=accept-new",
        ]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.key_file:
            argv += ["-i", self.key_file]
        return [*argv, f"{self.user}@{self.host}", command]

    def run(self, command: str, *, data: bytes | None = None, timeout: float = 300.0, what: str = "") -> bytes:
        """Run ``command`` on the pod; its stdout. LaunchError (naming ``what``, the pod and
        ssh's stderr) when ssh or the command fails."""
        argv = self.ssh(command)
        try:
            proc = subprocess.run(
                argv,
                input=data,
                capture_output=True,
                timeout=timeout,
                stdin=None if data is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise LaunchError("`ssh` was not found on PATH: olmx reaches RunPod pods with OpenSSH's client") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{what or command}: {self} did not answer within {timeout:g} s") from None
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace").strip()[-2000:] or "(no output)"
            raise LaunchError(f"{what or command} on {self} failed (ssh exit status {proc.returncode}): {detail}")
        return proc.stdout

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def wait_for_ssh(remote: Remote, *, timeout: float, poll: float = 5.0) -> tuple[float, int]:
    """Retry ``ssh ... true`` until the pod's sshd answers; ``(seconds it took, tries)``.

    Only a failed connection (ssh's exit status 255) is retried, for at most ``timeout``
    seconds; three refusals of the key in a row end the wait at once (a key that RunPod did
    not install stays refused). LaunchError with ssh's last answer when it never answered.
    """
    start = time.monotonic()
    tries = denied = 0
    while True:
        tries += 1
        try:
            proc = subprocess.run(
                remote.ssh("true"), capture_output=True, timeout=60, stdin=subprocess.DEVNULL, check=False
            )
            code, said = proc.returncode, proc.stderr.decode(errors="replace").strip()[-500:]
        except subprocess.TimeoutExpired:
            code, said = 255, "no answer within 60 s"
        except FileNotFoundError:
            raise LaunchError("`ssh` was not found on PATH: olmx reaches RunPod pods with OpenSSH's client") from None
        if code != 255:  # sshd ran the command: it is up
            return time.monotonic() - start, tries
        denied = denied + 1 if "Permission denied" in said else 0
        waited = time.monotonic() - start
        if denied >= 3:
            raise LaunchError(
                f"the pod's sshd ({remote}) refused the SSH key {denied} times: the key ssh offers is not one "
                f"RunPod installed (see `olmx provision runpod ssh-keys`; infra.ssh_key). Last answer: {said}"
            )
        if waited + poll > timeout:
            raise LaunchError(
                f"the pod's sshd ({remote}) did not answer within {timeout:g} s ({tries} tries; "
                f"infra.ssh_wait_timeout). Last answer: {said or '(none)'}"
            )
        time.sleep(poll)


# ------------------------------------------------------------------------------- ship


def source_root() -> Path:
    """The olmx checkout this olmx runs from (an editable install or the repository)."""
    import olmx

    root = Path(olmx.__file__).resolve().parents[1]
    if not all((root / part).exists() for part in SOURCE_PARTS):
        raise LaunchError(
            f"olmx is not running from a checkout ({root} lacks {', '.join(SOURCE_PARTS)}), so there is no "
            "source to ship: use an image that has olmx installed and set infra.install=false"
        )
    return root


def bundle(files: dict[str, bytes], trees: Iterable[tuple[str, Path]] = ()) -> bytes:
    """A gzipped tar holding ``files`` (name -> content) and the directory trees
    ``(name, path)``, without ``__pycache__`` folders and compiled files."""

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if "__pycache__" in parts or info.name.endswith((".pyc", ".pyo")) or ".egg-info" in info.name:
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
        for name, path in trees:
            tar.add(str(path), arcname=name, filter=skip)
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def ship(remote: Remote, workdir: str, data: bytes) -> None:
    """Unpack the bundle ``data`` into ``workdir`` on the pod (replacing its run status)."""
    w = shlex.quote(workdir)
    remote.run(
        f"mkdir -p {w} && rm -rf {w}/status && tar -xzf - -C {w}",
        data=data,
        timeout=1800,
        what="copying the run to the pod",
    )


def start(remote: Remote, workdir: str, *, rank: int = 0, nnodes: int = 1) -> None:
    """Start the bootstrap in the background, in its own session (it survives the ssh
    connection), as node ``rank`` of ``nnodes`` (olmx knows the order of a cluster's pods, so
    it does not rely on the pod's environment for this)."""
    w = shlex.quote(workdir)
    remote.run(
        f"cd {w} && (NODE_RANK={int(rank)} NUM_NODES={int(nnodes)} nohup setsid bash bootstrap.sh "
        ">/dev/null 2>&1 </dev/null &)",
        timeout=60,
        what="starting the bootstrap",
    )


def kill(remote: Remote, workdir: str, rank: int = 0) -> None:
    """SIGTERM the node's bootstrap and everything it started (its process group)."""
    pid = shlex.quote(f"{workdir}/status/pid.node{rank}")
    remote.run(
        f"test -f {pid} && kill -TERM -- -$(cat {pid}) 2>/dev/null; true", timeout=60, what="stopping the training"
    )


# ------------------------------------------------------------------------------- watch


class Watch:
    """Mirrors node ``rank``'s ``metrics.jsonl`` and log into the local run directory and
    reports the bootstrap's exit status."""

    def __init__(self, remote: Remote, workdir: str, run_dir: str | Path, *, rank: int = 0) -> None:
        self.remote, self.workdir, self.rank = remote, workdir, rank
        self.metrics = Path(run_dir) / "metrics.jsonl"
        self.log = Path(run_dir) / "logs" / f"node{rank}.log"
        self.offsets = [0, 0]

    def reset(self) -> None:
        """Empty the local copies: the pod's files are the truth from now on."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        for path in (self.metrics, self.log):
            path.write_bytes(b"")
        self.offsets = [0, 0]

    def look(self) -> int | None:
        """One look: append what is new; the exit status once the bootstrap has ended (255 if
        it died without writing one)."""
        command = _PROBE.format(
            work=shlex.quote(self.workdir),
            rank=self.rank,
            chunk=_CHUNK,
            mo=self.offsets[0],
            lo=self.offsets[1],
            alive=_ALIVE.format(),
        )
        answer = self.remote.run(command, timeout=60, what="checking on the training")
        head, _, body = answer.partition(b"\n")
        try:
            msize, moff, mlen, lsize, loff, llen = map(int, head.split()[:6])
            code, alive = head.split()[6:8]
        except ValueError:
            raise LaunchError(f"checking on the training on {self.remote}: unexpected answer {head[:200]!r}") from None
        chunks = (body[:mlen], body[mlen : mlen + llen])
        for i, (path, offset, chunk) in enumerate(zip((self.metrics, self.log), (moff, loff), chunks, strict=True)):
            if offset < self.offsets[i]:  # the pod's file was truncated (a resumed run)
                path.write_bytes(b"")
            with open(path, "ab") as f:
                f.write(chunk)
            self.offsets[i] = offset + len(chunk)
        if code != b"-":
            return int(code)
        return None if alive == b"1" else 255


def state(remote: Remote, workdir: str, rank: int = 0) -> tuple[int | None, dict | None]:
    """``(exit status or None while it runs, last metrics record)`` of node ``rank``; 255
    when its bootstrap died without an exit status."""
    w = shlex.quote(workdir)
    out = (
        remote.run(
            f"cd {w} || exit 1\n{_ALIVE.format()}\nalive status/pid.node{rank} && a=running || a=255\n"
            f"cat status/exit.node{rank} 2>/dev/null || echo $a\ntail -n 1 run/metrics.jsonl 2>/dev/null; true",
            timeout=60,
            what="checking on the training",
        )
        .decode(errors="replace")
        .splitlines()
    )
    code = None if not out or out[0].strip() == "running" else int(out[0])
    try:
        last = json.loads(out[1]) if len(out) > 1 and out[1].strip() else None
    except ValueError:
        last = None
    return code, last


def wait_ended(look: Any, poll: float, timeout: float = 120.0) -> None:
    """Wait until ``look()`` reports an exit status (the bootstrap ended after a SIGTERM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if look() is not None:
                return
        except LaunchError:
            pass
        time.sleep(min(poll, 2.0))


# ------------------------------------------------------------------------------- fetch


def fetch(remote: Remote, workdir: str, run_dir: str | Path) -> None:
    """Copy the pod's run directory (all but its ``plan.yaml``) into the local one, streamed
    (checkpoints can be large)."""
    argv = remote.ssh(f"cd {shlex.quote(workdir + '/run')} && tar -cf - --exclude=./plan.yaml .")
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(run_dir, filter="data")
        except tarfile.TarError as exc:
            proc.kill()
            problem: str | None = f"{exc}"
        else:
            problem = None
        stderr = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        proc.wait()
    if problem is not None or proc.returncode != 0:
        raise LaunchError(
            f"copying the run directory back from {remote} failed "
            f"(ssh exit status {proc.returncode}): {problem or stderr or '(no output)'}"
        )


def localize_summary(run_dir: str) -> None:
    """The copied ``summary.json`` names the pod's run directory; name the local one."""
    path = RunDir(run_dir).summary
    if path.exists():
        summary = json.loads(path.read_text())
        summary["run_dir"] = str(run_dir)
        path.write_text(json.dumps(summary, indent=2) + "\n")
