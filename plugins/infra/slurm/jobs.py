"""The Slurm side of olmx's ``slurm`` infra plugin: render the batch script, submit it, follow
the job, cancel it, read its log.

Only the Slurm client commands are used (``sbatch``, ``squeue``, ``scontrol``, ``scancel``).
No ``sacct``, since a cluster without slurmdbd (such as the test cluster of
``scripts/slurm/up.sh``) has none: the state of a job comes from ``squeue`` while it is
queued or running and from ``scontrol show job`` once it has ended (slurmctld keeps an ended
job for ``MinJobAge`` seconds, 300 by default).

The batch script (``templates/slurm/sbatch.sh.j2``) starts one ``srun`` task per node; each
task runs torchrun, and the torchruns meet in a c10d rendezvous on the first node of the
allocation, on a port derived from the job id.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time as _time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from olmx.errors import LaunchError

#: Path of the batch-script template inside the templates folder (``olmx.templates``).
TEMPLATE = "slurm/sbatch.sh.j2"

#: The c10d rendezvous listens on ``PORT_BASE + job_id % PORT_SPAN``: below Linux's
#: ephemeral range (32768 and up), so no outgoing connection already holds it, and different
#: for jobs that share a first node.
PORT_BASE = 15000
PORT_SPAN = 10000

#: Job states after which a job does not run again (Slurm's long state names).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

# Values that land in `#SBATCH --opt=value` lines, which sbatch splits on whitespace itself.
_OPTION_VALUE = re.compile(r"[^\s'\"\\]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB_ID = re.compile(r"\d+(_\d+)?")


class SlurmError(LaunchError):
    """A Slurm command is missing, failed or answered something unexpected; the message names
    the command and what it wrote to stderr."""


# ------------------------------------------------------------------------------- rendering


def render_sbatch(
    *,
    run_dir: str | os.PathLike[str],
    command: str | Sequence[str],
    nproc_per_node: int,
    nodes: int = 1,
    python: str = "python",
    job_name: str = "olmx",
    partition: str | None = None,
    account: str | None = None,
    time: str | int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    mem: str | None = None,
    signal_seconds: int | None = None,
    requeue: bool = False,
    container_image: str | None = None,
    container_mounts: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    extra_sbatch_args: Sequence[str] = (),
    torchrun_flags: Sequence[str] = (),
) -> str:
    """Render the sbatch script that runs ``command`` under torchrun on every node.

    Args:
        run_dir: Run directory, on a filesystem the nodes share; Slurm writes the job's
            output and errors to ``<run_dir>/slurm-<job id>.out``.
        command: The worker command that torchrun starts ``nproc_per_node`` times per node
            (``--no-python``: its first word is the program). A string is put in the script
            verbatim (one line of shell syntax, the caller quotes); a sequence is quoted
            word by word.
        nproc_per_node: Worker processes per node (GPUs per node on a GPU cluster).
        nodes: Number of nodes; one ``srun`` task, i.e. one torchrun, runs on each.
        python: Python executable on the nodes that runs ``-m torch.distributed.run``.
        job_name: Slurm job name.
        partition: ``--partition``; omitted when None.
        account: ``--account``; omitted when None.
        time: ``--time`` limit, in Slurm's syntax (``"02:00:00"``) or whole minutes.
        gpus_per_node: ``--gpus-per-node``; omitted when None.
        cpus_per_task: ``--cpus-per-task`` (the CPUs of one node's torchrun and all its
            workers); given to srun as well, which does not inherit it from sbatch.
        mem: ``--mem`` per node (``"64G"``); omitted when None.
        signal_seconds: Send SIGTERM to the batch script this many seconds before the time
            limit (``--signal=B:TERM@N``); the script passes it on to the job steps
            (``scancel --signal=TERM``), so that the workers can save a checkpoint.
            Omitted when None.
        requeue: Allow Slurm to requeue the job (``--requeue``, with ``--open-mode=append``
            so that a requeued run adds to the same log).
        container_image: Run each srun task in this image (pyxis ``--container-image``).
        container_mounts: pyxis ``--container-mounts`` (``"/src:/dst,..."``); with an image only.
        env: Variables exported in the batch script, inherited by srun and the workers.
        workdir: Directory the script changes to before starting srun; default ``run_dir``.
        extra_sbatch_args: Further ``#SBATCH`` options, each one ``--name[=value]`` word.
        torchrun_flags: Further torchrun options (:func:`olmx.launch.torchrun_flags`), quoted
            word by word.

    Raises:
        SlurmError: A value would not survive an ``#SBATCH`` line or the shell (whitespace
            or quotes in an option, a bad variable name, a multi-line command, ...); the
            message names the argument.
    """
    from olmx.launch import render_template

    run_dir = Path(run_dir).absolute()
    workdir = Path(workdir).absolute() if workdir is not None else run_dir
    for name, value in (("run_dir", run_dir), ("workdir", workdir)):
        if not _OPTION_VALUE.fullmatch(str(value)):
            raise SlurmError(f"slurm {name}={str(value)!r}: no whitespace or quotes allowed")
    for name, count in (("nproc_per_node", nproc_per_node), ("nodes", nodes)):
        if not isinstance(count, int) or count < 1:
            raise SlurmError(f"slurm {name}={count!r}: must be a whole number >= 1")
    for name, number in (
        ("gpus_per_node", gpus_per_node),
        ("cpus_per_task", cpus_per_task),
        ("signal_seconds", signal_seconds),
    ):
        if number is not None and (not isinstance(number, int) or number < 1):
            raise SlurmError(f"slurm {name}={number!r}: must be a whole number >= 1, or unset")
    for name, text in (
        ("job_name", job_name),
        ("partition", partition),
        ("account", account),
        ("time", time),
        ("mem", mem),
    ):
        if text is not None and not _OPTION_VALUE.fullmatch(str(text)):
            raise SlurmError(f"slurm {name}={text!r}: no whitespace or quotes allowed")
    for arg in extra_sbatch_args:
        if not (arg.startswith("--") and _OPTION_VALUE.fullmatch(arg)):
            raise SlurmError(f"slurm extra_sbatch_args: {arg!r} is not one '--option[=value]' word")
    env = dict(env or {})
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise SlurmError(f"slurm env: {key!r} is not a valid environment variable name")
    if isinstance(command, str):
        if not command.strip() or "\n" in command:
            raise SlurmError(f"slurm command={command!r}: must be one non-empty line")
    elif not command:
        raise SlurmError("slurm command: empty")
    else:
        command = shlex.join(command)

    return render_template(
        TEMPLATE,
        run_dir=str(run_dir),
        command=command,
        nproc_per_node=nproc_per_node,
        nodes=nodes,
        python=python,
        job_name=job_name,
        partition=partition,
        account=account,
        time=time,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
        signal_seconds=signal_seconds,
        requeue=requeue,
        container_image=container_image,
        container_mounts=container_mounts,
        env=list(env.items()),
        workdir=str(workdir),
        extra_sbatch_args=list(extra_sbatch_args),
        torchrun_flags=list(torchrun_flags),
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
    )


# ------------------------------------------------------------------------------- commands


def _run(cmd: Sequence[str], *, timeout: float = 60.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; SlurmError if it is not installed or hangs."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except FileNotFoundError:
        raise SlurmError(
            f"`{cmd[0]}` was not found on PATH: run olmx on a Slurm login node "
            "(for a local test cluster: scripts/slurm/up.sh)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(cmd)}` did not answer within {timeout:g} s") from None


def _failed(cmd: Sequence[str], proc: subprocess.CompletedProcess[str]) -> SlurmError:
    detail = (proc.stderr or proc.stdout).strip() or "(no output)"
    return SlurmError(f"`{shlex.join(cmd)}` failed with exit status {proc.returncode}: {detail}")


def submit(script_text: str, *, run_dir: str | os.PathLike[str], filename: str = "sbatch.sh") -> str:
    """Write ``script_text`` to ``<run_dir>/<filename>`` and submit it with ``sbatch --parsable``
    from ``run_dir``; return the job id (a string of digits)."""
    run_dir = Path(run_dir).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / filename
    script.write_text(script_text)
    script.chmod(0o755)
    cmd = ["sbatch", "--parsable", str(script)]
    proc = _run(cmd, cwd=run_dir)
    if proc.returncode != 0:
        raise _failed(cmd, proc)
    # --parsable prints "<id>" or "<id>;<cluster>".
    job_id = proc.stdout.strip().split(";")[0]
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError(f"`{shlex.join(cmd)}` printed {proc.stdout!r}, not a job id")
    return job_id


def job_details(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict of its ``Key=Value`` fields (``JobState``, ``Reason``,
    ``RunTime``, ``NodeList``, ``ExitCode``, ...), while the job is known to slurmctld."""
    cmd = ["scontrol", "show", "job", "--oneliner", str(job_id)]
    proc = _run(cmd)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            raise SlurmError(
                f"Slurm does not know job {job_id} (`{shlex.join(cmd)}`: {proc.stderr.strip()}); "
                "it never existed or ended longer ago than slurmctld's MinJobAge"
            )
        raise _failed(cmd, proc)
    fields: dict[str, str] = {}
    for key, value in re.findall(r"(?:^|\s)([A-Za-z][A-Za-z:/_]*)=(\S*)", proc.stdout):
        fields.setdefault(key, value)
    if "JobState" not in fields:
        raise SlurmError(f"`{shlex.join(cmd)}` printed no JobState: {proc.stdout.strip()!r}")
    return fields


def job_state(job_id: str) -> str:
    """The job's state in Slurm's long form (``PENDING``, ``RUNNING``, ``COMPLETED``,
    ``FAILED``, ``CANCELLED``, ``TIMEOUT``, ...): from ``squeue`` while the job is queued or
    running, else from ``scontrol show job``."""
    cmd = ["squeue", "--noheader", "--jobs", str(job_id), "--format", "%T"]
    proc = _run(cmd)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.split()[0]
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise _failed(cmd, proc)
    return job_details(job_id)["JobState"]


def job_exit_code(fields: Mapping[str, str]) -> int | None:
    """Slurm's ``ExitCode=<status>:<signal>`` as one shell-style number (128 + signal when a
    signal ended the batch script)."""
    match = re.fullmatch(r"(\d+):(\d+)", fields.get("ExitCode", ""))
    if match is None:
        return None
    status, signal = int(match[1]), int(match[2])
    return 128 + signal if signal else status


def wait(
    job_id: str,
    *,
    on_state: Callable[[str], object] | None = None,
    poll: float = 5.0,
    timeout: float | None = None,
) -> tuple[str, int | None]:
    """Poll the job every ``poll`` seconds until it reaches a state in
    :data:`TERMINAL_STATES`; return ``(state, exit_code)``.

    ``on_state`` is called with each new state as it is first seen (also the first one).
    ``exit_code`` is the batch script's exit status (the script exits with srun's, which is
    torchrun's: 1 when a worker failed), 128 + the signal number when a signal ended the
    script, or None when Slurm no longer holds the record. A ``CANCELLED`` job's code says
    little: the script traps SIGTERM and exits with whatever srun returned.

    Raises:
        SlurmError: ``timeout`` seconds passed first (the job keeps running), or a Slurm
            command failed.
    """
    deadline = None if timeout is None else _time.monotonic() + timeout
    last = None
    while True:
        state = job_state(job_id)
        if state != last:
            last = state
            if on_state is not None:
                on_state(state)
        if state in TERMINAL_STATES:
            return _ended(job_id, state)
        if deadline is not None and _time.monotonic() >= deadline:
            raise SlurmError(f"job {job_id} is still {state} after {timeout:g} s")
        _time.sleep(poll)


def outcome(job_id: str) -> tuple[str, int | None] | None:
    """One look at the job, for a caller that polls by itself: None while it is queued or
    running, else ``(state, exit_code)`` as :func:`wait` returns them."""
    state = job_state(job_id)
    return _ended(job_id, state) if state in TERMINAL_STATES else None


def _ended(job_id: str, state: str) -> tuple[str, int | None]:
    try:
        return state, job_exit_code(job_details(job_id))
    except SlurmError:
        return state, None


def cancel(job_id: str, *, signal: str | None = None, batch_only: bool = False) -> None:
    """Cancel the job (``scancel``). With ``signal`` (``"TERM"``, ``"USR1"``, ...) only send
    that signal, to every job step, or with ``batch_only`` to the batch script alone (which
    passes SIGTERM on to the job steps). A job that has already ended is not an error."""
    cmd = ["scancel"]
    if signal is not None:
        cmd.append(f"--signal={signal}")
    if batch_only:
        cmd.append("--batch")
    cmd.append(str(job_id))
    proc = _run(cmd)
    if proc.returncode != 0 and "already completing or completed" not in proc.stderr:
        raise _failed(cmd, proc)


# ------------------------------------------------------------------------------- logs


def log_path(job_id: str, run_dir: str | os.PathLike[str]) -> Path:
    """Where the job's output and errors go (``--output``/``--error`` of the template)."""
    return Path(run_dir).absolute() / f"slurm-{job_id}.out"
