"""The Slurm side of olmx's ``slurm`` infra plugin: render the batch script, submit it, follow
the job, cancel it, read its log.

Only the Slurm client commands are used (``sbatch``, ``squeue``, ``scontrol``, ``scancel``).
No ``sacct``, since a cluster without slurmdbd (such as the test cluster of
``scripts/slurm/up.sh``) has none: the state of a job comes from ``squeue`` while it is
queued or running and from ``scontrol show job`` once it has ended (slurmctld keeps an ended
job for ``MinJobAge`` seconds, 300 by default).

The batch script (``templates/slurm/sbatch.sh.j2``) starts one ``srun`` task per node; each
task runs torchrun, and the torchruns meet in a c10d rendezvous on the first node of the
allocation, on a port derived from the job id. Each task gets every CPU the job has on its
node (or ``cpus_per_task``), passed to srun explicitly; it may run in a pyxis or Apptainer
container. A job that may be requeued is followed through its requeues (:class:`JobEnd`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time as _time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

from olmx.errors import LaunchError
from olmx.events import LAUNCH_ENV

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

#: Of :data:`TERMINAL_STATES`, those a job that may be requeued (``--requeue``) comes back
#: from: Slurm requeues it after a node failure or a pre-emption (``PreemptMode=REQUEUE``).
#: Slurm 22.05 moves such a job straight back to ``PENDING`` (``Restarts`` counts up); other
#: versions, and ``sacct``, may show one of these states first.
REQUEUABLE_STATES = frozenset({"NODE_FAIL", "PREEMPTED"})

#: Seconds a job that may be requeued stays in one of :data:`REQUEUABLE_STATES` before olmx
#: takes that state as its end (a cluster that cancels pre-empted jobs, or does not requeue).
REQUEUE_GRACE_S = 60.0

#: States of a job that Slurm holds until someone releases it (``scontrol release``): not an
#: end, but the job will not run by itself either.
HELD_STATES = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"})

#: How the batch script asks for GPUs: ``--gpus-per-node=[type:]N`` or, for clusters that
#: configure GPUs only as generic resources, ``--gres=gpu[:type]:N``.
GpuRequest = StrEnum("GpuRequest", [("gpus-per-node", "gpus-per-node"), ("gres", "gres")])
GPU_REQUESTS = tuple(m.value for m in GpuRequest)


#: Container runtimes of the batch script: pyxis (``srun --container-image``, enroot images)
#: and Apptainer or SingularityCE (``apptainer|singularity exec IMAGE ...`` in each srun task).
class ContainerRuntime(StrEnum):
    """:data:`CONTAINER_RUNTIMES` as the config's closed choice."""

    pyxis = "pyxis"
    apptainer = "apptainer"
    singularity = "singularity"


CONTAINER_RUNTIMES = tuple(m.value for m in ContainerRuntime)

# Values that land in `#SBATCH --opt=value` lines, which sbatch splits on whitespace itself.
_OPTION_VALUE = re.compile(r"[^\s'\"\\]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB_ID = re.compile(r"\d+(_\d+)?")
# --mem: a whole number with an optional unit (sbatch's default unit is M); 0 = all of it.
_MEM = re.compile(r"\d+[KMGTkmgt]?")
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# A container mount: SRC:DST or SRC:DST:FLAGS (ro, rw, pyxis' "ro+private", ...), absolute paths.
_MOUNT = re.compile(r"/[^\s,:'\"\\]*:/[^\s,:'\"\\]*(:[A-Za-z0-9+]+)?")
_IMAGE = re.compile(r"[^\s,'\"\\]+")
# Slurm's --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)")


class SlurmError(LaunchError):
    """A Slurm command is missing, failed or answered something unexpected; the message names
    the command and what it wrote to stderr."""


def time_limit_seconds(limit: str | int | None) -> int | None:
    """Seconds of a ``--time`` value in Slurm's syntax (``"90"`` minutes, ``"30:00"``
    minutes:seconds, ``"02:00:00"``, ``"1-12"`` days-hours, ``"1-00:00:00"``); None for no limit
    (None, ``0``, ``UNLIMITED``, ``INFINITE``).

    Raises:
        SlurmError: Not one of those forms (the message names ``time``).
    """
    if limit is None:
        return None
    text = str(limit)
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = _TIME.fullmatch(text)
    if match is None:
        raise SlurmError(
            f"slurm time={limit!r}: not a Slurm time limit; write minutes (90), MM:SS, HH:MM:SS, "
            "D-HH, D-HH:MM or D-HH:MM:SS (1-00:00:00), or UNLIMITED"
        )
    days, d_hours, d_minutes, d_seconds, minutes, m_seconds, h_seconds = match.groups()
    if days is not None:
        total = int(days) * 86400 + int(d_hours) * 3600 + int(d_minutes or 0) * 60 + int(d_seconds or 0)
    elif h_seconds is not None:  # HH:MM:SS
        total = int(minutes) * 3600 + int(m_seconds) * 60 + int(h_seconds)
    else:  # MM or MM:SS
        total = int(minutes) * 60 + int(m_seconds or 0)
    return total or None  # --time=0: no limit


def gpu_option(gpus_per_node: int, *, gpu_type: str | None = None, request: str = "gpus-per-node") -> str:
    """The option that asks for ``gpus_per_node`` GPUs on each node, in the style ``request``
    (:data:`GPU_REQUESTS`): ``--gpus-per-node=[type:]N`` or ``--gres=gpu[:type]:N``."""
    if request not in GPU_REQUESTS:
        raise SlurmError(f"slurm gpu_request={request!r}: allowed: {', '.join(GPU_REQUESTS)}")
    if gpu_type is not None and not _GPU_TYPE.fullmatch(gpu_type):
        raise SlurmError(f"slurm gpu_type={gpu_type!r}: one Slurm GPU type name (h100, a100_80g), no ':' or ','")
    typed = f"{gpu_type}:" if gpu_type else ""
    return (
        f"--gpus-per-node={typed}{gpus_per_node}"
        if request == "gpus-per-node"
        else f"--gres=gpu:{typed}{gpus_per_node}"
    )


class JobEnd:
    """Tells, from the states of one job seen one after the other, when it has ended for good.

    A state of :data:`TERMINAL_STATES` is the end, except that a job that may be requeued
    (``requeue=True``) is given ``grace`` seconds to come back from one of
    :data:`REQUEUABLE_STATES`."""

    def __init__(self, *, requeue: bool, grace: float | None = None, clock: Callable[[], float] = _time.monotonic):
        self.requeue = requeue
        self.grace = REQUEUE_GRACE_S if grace is None else grace
        self._clock = clock
        self._since: float | None = None

    def final(self, state: str) -> bool:
        """Whether ``state``, just seen, is the job's end."""
        if state not in TERMINAL_STATES:
            self._since = None
            return False
        if not (self.requeue and state in REQUEUABLE_STATES):
            return True
        if self._since is None:
            self._since = self._clock()
        return self._clock() - self._since >= self.grace

    def waiting(self) -> float | None:
        """Seconds the job has been in one of :data:`REQUEUABLE_STATES`, waiting to be
        requeued; None when it is not."""
        return None if self._since is None else self._clock() - self._since


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
    gpu_type: str | None = None,
    gpu_request: str = "gpus-per-node",
    cpus_per_task: int | None = None,
    exclusive: bool = False,
    mem: str | None = None,
    signal_seconds: int | None = None,
    requeue: bool = False,
    max_requeues: int | None = None,
    container_runtime: str = "pyxis",
    container_image: str | None = None,
    container_mounts: Sequence[str] = (),
    container_env: Sequence[str] = (),
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
        python: Python executable on the nodes (in the container, with one) that runs
            ``-m torch.distributed.run``.
        job_name: Slurm job name.
        partition: ``--partition``; omitted when None.
        account: ``--account``; omitted when None.
        time: ``--time`` limit, in Slurm's syntax (``"02:00:00"``) or whole minutes.
        gpus_per_node: GPUs of each node, asked for with :func:`gpu_option` in the batch
            script and in srun; none when None.
        gpu_type: Slurm's GPU type name (``h100``) in that option; any GPU when None.
        gpu_request: ``"gpus-per-node"`` or ``"gres"`` (:data:`GPU_REQUESTS`).
        cpus_per_task: ``--cpus-per-task`` of the job (the CPUs of one node's torchrun and
            all its workers). None: the task gets every CPU the job has on its node (the
            smallest count, from ``SLURM_JOB_CPUS_PER_NODE``): the whole node with
            ``exclusive``. Either way srun is given the number, since srun does not take it
            from the batch job (Slurm 22.05 and later).
        exclusive: ``--exclusive``: the nodes are the job's alone, with all their CPUs.
        mem: ``--mem`` per node (``"64G"``; ``"0"``: all of it); omitted when None.
        signal_seconds: Send SIGTERM to the batch script this many seconds before the time
            limit (``--signal=B:TERM@N``); the script passes it on to the job steps
            (``scancel --signal=TERM``), so that the workers can save a checkpoint.
            Omitted when None.
        requeue: Allow Slurm to requeue the job (``--requeue``, with ``--open-mode=append``
            so that a requeued run adds to the same log); a run that stopped with a
            checkpoint (exit 75) requeues the job itself.
        max_requeues: With ``requeue``: the script requeues the job itself only while
            ``SLURM_RESTART_COUNT`` (requeues so far, Slurm's own included) is below this;
            else it exits 75. None: no cap.
        container_runtime: ``"pyxis"``, ``"apptainer"`` or ``"singularity"``
            (:data:`CONTAINER_RUNTIMES`), used with ``container_image``.
        container_image: Run each srun task (and the script's outcome check) in this image.
            pyxis: ``srun --container-image`` (named ``olmx`` within the job, so the outcome
            check reuses it); Apptainer/Singularity: ``apptainer exec IMAGE`` inside srun,
            with ``--nv`` when there are GPUs.
        container_mounts: Host paths inside the container, each ``"/src:/dst[:flags]"``
            (pyxis ``--container-mounts``, Apptainer ``--bind``).
        container_env: Names of variables whose values from the job's environment override
            the image's own (pyxis ``--container-env``; Apptainer: ``APPTAINERENV_<name>``),
            besides ``env``'s and ``OLMX_LAUNCH_ID``, which always do.
        env: Variables exported in the batch script, inherited by srun and the workers.
        workdir: Directory the script changes to before starting srun (and the container's
            working directory); default ``run_dir``.
        extra_sbatch_args: Further ``#SBATCH`` options, each one ``--name[=value]`` word.
        torchrun_flags: Further torchrun options (:func:`olmx.launch.torchrun_flags`), quoted
            word by word.

    Raises:
        SlurmError: A value would not survive an ``#SBATCH`` line or the shell (whitespace
            or quotes in an option, a bad variable name, a multi-line command, ...), or is
            not one Slurm or the container runtime takes; the message names the argument.
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
    if signal_seconds is not None and signal_seconds > 0xFFFF:
        raise SlurmError(f"slurm signal_seconds={signal_seconds}: Slurm's --signal takes at most 65535 seconds")
    if max_requeues is not None and (not isinstance(max_requeues, int) or max_requeues < 0):
        raise SlurmError(f"slurm max_requeues={max_requeues!r}: must be a whole number >= 0, or unset")
    for name, text in (
        ("job_name", job_name),
        ("partition", partition),
        ("account", account),
        ("time", time),
    ):
        if text is not None and not _OPTION_VALUE.fullmatch(str(text)):
            raise SlurmError(f"slurm {name}={text!r}: no whitespace or quotes allowed")
    time_limit_seconds(time)
    if mem is not None and not _MEM.fullmatch(str(mem)):
        raise SlurmError(
            f"slurm mem={mem!r}: Slurm's --mem takes a whole number with an optional unit K, M, G or T "
            "(500G), or 0 for all of each node's memory"
        )
    gpus = gpu_option(gpus_per_node, gpu_type=gpu_type, request=gpu_request) if gpus_per_node else None
    for arg in extra_sbatch_args:
        if not (arg.startswith("--") and _OPTION_VALUE.fullmatch(arg)):
            raise SlurmError(f"slurm extra_sbatch_args: {arg!r} is not one '--option[=value]' word")
    env = dict(env or {})
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise SlurmError(f"slurm env: {key!r} is not a valid environment variable name")
    srun_container, exec_prefix, events_prefix, override = _container(
        container_runtime, container_image, container_mounts, container_env, env, workdir, bool(gpus_per_node)
    )
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
        gpu_option=gpus,
        cpus_per_task=cpus_per_task,
        exclusive=exclusive,
        mem=mem,
        signal_seconds=signal_seconds,
        requeue=requeue,
        max_requeues=max_requeues,
        container_runtime=container_runtime if container_image else None,
        # Shell words, quoted here: a template line that starts with a loop loses its indent.
        srun_container="".join(" " + shlex.quote(word) for word in srun_container),
        exec_prefix="".join(shlex.quote(word) + " " for word in exec_prefix),
        events_prefix="".join(
            shlex.quote(word) + " "
            for word in ([*("srun", "--nodes=1", "--ntasks=1"), *srun_container] if srun_container else events_prefix)
        ),
        container_override=override,
        env=list(env.items()),
        workdir=str(workdir),
        extra_sbatch_args=list(extra_sbatch_args),
        torchrun_flags=list(torchrun_flags),
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
    )


def _container(
    runtime: str,
    image: str | None,
    mounts: Sequence[str],
    names: Sequence[str],
    env: Mapping[str, str],
    workdir: Path,
    gpus: bool,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """The container's words: srun options (pyxis), the prefix of the training command and of
    the outcome check (Apptainer/Singularity), and the names of the variables whose values from
    the job's environment override the image's."""
    if runtime not in CONTAINER_RUNTIMES:
        raise SlurmError(f"slurm container_runtime={runtime!r}: allowed: {', '.join(CONTAINER_RUNTIMES)}")
    mounts, names = list(mounts), list(names)
    if image is None:
        if mounts or names:
            what = "container_mounts" if mounts else "container_env"
            raise SlurmError(f"slurm {what}: set without a container image; they apply only inside a container")
        return [], [], [], []
    if not _IMAGE.fullmatch(image):
        raise SlurmError(f"slurm container_image={image!r}: one word, no whitespace, quotes or ','")
    for mount in mounts:
        if not _MOUNT.fullmatch(mount):
            raise SlurmError(
                f"slurm container_mounts: {mount!r} is not '/src:/dst' or '/src:/dst:flags' "
                "(absolute paths, no whitespace, quotes or ','), e.g. '/shared:/shared'"
            )
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise SlurmError(f"slurm container_env: {name!r} is not a valid environment variable name")
    override = sorted({*env, LAUNCH_ENV, *names})
    if runtime == "pyxis":
        srun = [f"--container-image={image}", "--container-name=olmx"]
        srun += [f"--container-mounts={','.join(mounts)}"] if mounts else []
        srun += [f"--container-workdir={workdir}", f"--container-env={','.join(override)}"]
        return srun, [], [], override
    prefix = [runtime, "exec"]
    prefix += [f"--bind={','.join(mounts)}"] if mounts else []
    prefix += [f"--pwd={workdir}"]
    return [], [*prefix[:2], *(["--nv"] if gpus else []), *prefix[2:], image], [*prefix, image], override


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
    requeue: bool = False,
    grace: float | None = None,
) -> tuple[str, int | None]:
    """Poll the job every ``poll`` seconds until it has ended (:class:`JobEnd`: a state in
    :data:`TERMINAL_STATES`; with ``requeue``, one of :data:`REQUEUABLE_STATES` only once the
    job has stayed in it ``grace`` seconds, default :data:`REQUEUE_GRACE_S`); return
    ``(state, exit_code)``. A requeued job is followed through its next runs.

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
    end = JobEnd(requeue=requeue, grace=grace)
    last = None
    while True:
        state = job_state(job_id)
        if state != last:
            last = state
            if on_state is not None:
                on_state(state)
        if end.final(state):
            return _ended(job_id, state)
        if deadline is not None and _time.monotonic() >= deadline:
            raise SlurmError(f"job {job_id} is still {state} after {timeout:g} s")
        _time.sleep(poll)


def outcome(job_id: str) -> tuple[str, int | None] | None:
    """One look at the job, for a caller that polls by itself: None while it is queued or
    running, else ``(state, exit_code)`` as :func:`wait` returns them. (A job that may be
    requeued needs several looks: :class:`JobEnd`.)"""
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
