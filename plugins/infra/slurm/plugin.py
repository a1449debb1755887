"""A Slurm cluster: one sbatch job per run (torchrun on every node), followed from the terminal.

``olmx train infra=slurm ...`` renders ``templates/slurm/sbatch.sh.j2`` (one srun task per node,
each running torchrun; the torchruns meet in a c10d rendezvous on the first node), writes it
to ``RUN_DIR/sbatch.sh``, submits it with ``sbatch`` and records the job in
``RUN_DIR/launch.json``. It then shows the queue state on a status line, and once the job
runs, the progress bar drawn from ``RUN_DIR/metrics.jsonl`` (the run directory must be on
storage that the login node and the compute nodes share). Ctrl-C asks whether to cancel the
job; without a terminal to ask on, the job keeps running and olmx prints how to reach it.
``infra.detach=true`` submits and returns; ``olmx jobs status|logs|cancel RUN_DIR`` work on
the job later. With ``infra.requeue=true`` olmx follows the job through its requeues (its own,
after a run stopped with a checkpoint, at most ``infra.max_requeues``; Slurm's, after a node
failure or pre-emption) until it really ends.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from olmx.api import InfraPlugin, World, setting
from olmx.errors import ConfigError, LaunchError, RunFailed
from olmx.launch import TorchrunConfig, torchrun_env
from olmx.rundir import RunDir, tail
from olmx_plugins.infra.slurm.jobs import ContainerRuntime, GpuRequest

#: File in the run directory that holds the submitted batch script.
SCRIPT_FILE = "sbatch.sh"


#: Seconds the default ``infra.signal_seconds`` adds to ``infra.stop_timeout``: for the batch
#: script to pass SIGTERM on, torchrun to stop, the outcome check and the requeue. (Slurm may
#: send the signal up to 60 s early, never late.)
SIGNAL_MARGIN_S = 60

#: ``extra_sbatch_args`` options that olmx sets itself, with the setting to use instead.
OWN_OPTIONS = {
    "--nodes": "infra.nodes",
    "--ntasks-per-node": "infra.nodes (one task per node)",
    "--ntasks": "infra.nodes (one task per node)",
    "--job-name": "infra.job_name",
    "--partition": "infra.partition",
    "--account": "infra.account",
    "--time": "infra.time",
    "--output": "trainer.run_dir (the log is RUN_DIR/slurm-<job id>.out)",
    "--error": "trainer.run_dir (the log is RUN_DIR/slurm-<job id>.out)",
    "--open-mode": "infra.requeue",
    "--cpus-per-task": "infra.cpus_per_task",
    "--mem": "infra.mem",
    "--exclusive": "infra.exclusive",
    "--gpus-per-node": "infra.gpus_per_node (and infra.gpu_type)",
    "--gpus": "infra.gpus_per_node (and infra.gpu_type)",
    "--signal": "infra.signal_seconds",
    "--requeue": "infra.requeue",
    "--no-requeue": "infra.requeue",
}


@dataclass(frozen=True)
class SlurmContainerConfig:
    """``infra.container``: the image each node's task runs in."""

    #: ``pyxis`` (``srun --container-image``; enroot images: ``nvcr.io#nvidia/pytorch:25.01-py3``,
    #: a ``.sqsh`` file), ``apptainer`` or ``singularity`` (``apptainer exec IMAGE`` inside each
    #: srun task, ``--nv`` with GPUs; a ``.sif`` file, a sandbox folder, ``docker://...``).
    runtime: ContainerRuntime = setting(ContainerRuntime.pyxis)
    #: The image; null: no container (the nodes' own environment).
    image: Optional[str] = None
    #: Host paths seen in the container, each ``/src:/dst`` or ``/src:/dst:ro`` (pyxis
    #: ``--container-mounts``, Apptainer ``--bind``). The run directory and the data must be at
    #: the same paths inside (``/shared:/shared``); pyxis mounts nothing by itself.
    mounts: list[str] = field(default_factory=list)
    #: Names of variables of the submitting shell (which the job inherits) whose values override
    #: the image's own, e.g. ``[HF_TOKEN, NCCL_SOCKET_IFNAME]`` (pyxis ``--container-env``;
    #: Apptainer ``APPTAINERENV_<name>``). ``infra.env``'s names always do.
    env: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlurmConfig(TorchrunConfig):
    """Settings of ``infra=slurm``."""

    #: Nodes of the job (``--nodes``); one torchrun runs on each.
    nodes: int = setting(1, ge=1)
    #: GPUs per node (``--gpus-per-node``, or ``--gres`` with ``infra.gpu_request=gres``); 0
    #: trains on CPUs.
    gpus_per_node: int = setting(0, ge=0)
    #: How the job asks for GPUs: ``gpus-per-node`` (``--gpus-per-node=N``, ``=h100:N`` with a
    #: type) or ``gres`` (``--gres=gpu:N``, ``gpu:h100:N``: for clusters that configure GPUs
    #: only as generic resources); srun is given the same option.
    gpu_request: GpuRequest = setting(GpuRequest("gpus-per-node"))
    #: Slurm's GPU type name (the cluster's gres.conf ``Type``, e.g. ``h100``) in that option;
    #: null: any GPU. (``infra.gpu_name`` is the model olmx plans for.)
    gpu_type: Optional[str] = None
    #: Worker processes per node; null means one per GPU, or 2 CPU processes.
    nproc_per_node: Optional[int] = setting(None, ge=1, integer=True)
    #: GPU model of the nodes (e.g. ``NVIDIA H100 80GB HBM3``): shown in the plan, and its
    #: compute capability is what the precision plugins check (e.g. MXFP8 needs SM100).
    gpu_name: Optional[str] = None
    #: Slurm partition (``--partition``); null: the cluster's default.
    partition: Optional[str] = None
    #: Account to charge (``--account``).
    account: Optional[str] = None
    #: Time limit in Slurm's syntax (``02:00:00``, ``1-00:00:00``) or minutes.
    time: Optional[str] = None
    #: The nodes are the job's alone (``--exclusive``), with all their CPUs and (unless
    #: ``infra.mem`` says otherwise) all their memory. false: share nodes, and set
    #: ``infra.cpus_per_task``.
    exclusive: bool = True
    #: CPUs of each node's task (``--cpus-per-task``, given to srun too): torchrun and all its
    #: workers. null: every CPU of the node (with ``infra.exclusive``).
    cpus_per_task: Optional[int] = setting(None, ge=1, integer=True)
    #: Memory per node (``--mem``, e.g. ``500G``; ``0``: all of it). null: all of it with
    #: ``infra.exclusive`` (``--mem=0``), else the cluster's default.
    mem: Optional[str] = None
    #: The container of each node's task (``infra.container.image`` and its runtime, mounts
    #: and environment); none by default.
    container: SlurmContainerConfig = field(default_factory=SlurmContainerConfig)
    #: Removed: refused with a pointer to ``infra.container.image``.
    container_image: Optional[str] = None
    #: Removed: refused with a pointer to ``infra.container.mounts``.
    container_mounts: Optional[str] = None
    #: SIGTERM the job this many seconds before its time limit, so that the workers can save
    #: a checkpoint (``--signal=B:TERM@N``); at least ``infra.stop_timeout``. null:
    #: ``infra.stop_timeout`` + 60.
    signal_seconds: Optional[int] = setting(None, ge=1, integer=True)
    #: Let Slurm requeue the job (pre-emption, node failure); a run that saved a checkpoint
    #: and stopped requeues it too. It resumes from its last checkpoint in the same run
    #: directory; olmx follows it through its next runs.
    requeue: bool = False
    #: With ``infra.requeue``: the job requeues itself only while it has been requeued fewer
    #: than this many times (``SLURM_RESTART_COUNT``, Slurm's own requeues included); then it
    #: ends with exit code 75 (rerun the same ``olmx train`` to resume). A run longer than
    #: ``max_requeues + 1`` time limits needs more.
    max_requeues: int = setting(3, ge=0)
    #: Submit, print the job id and return at once (then ``olmx jobs status RUN_DIR``).
    detach: bool = False
    #: Python on the nodes that runs torchrun and ``olmx run`` (it needs olmx installed);
    #: null: ``python`` in a container, else the Python running this olmx (right when the
    #: environment is on shared storage).
    python: Optional[str] = None
    #: Extra environment variables of the job. They are written into the plan and the batch
    #: script, so no secrets here: the job inherits the submitting shell's environment anyway.
    env: dict[str, str] = field(default_factory=dict)
    #: Slurm job name.
    job_name: str = "olmx"
    #: Further ``#SBATCH`` options, each one ``--name=value`` word (``--qos=high``); not the
    #: ones olmx sets from its own settings (``--mem``: ``infra.mem``, ...).
    extra_sbatch_args: list[str] = field(default_factory=list)
    #: Seconds between two questions to Slurm while following the job.
    poll_seconds: float = setting(5.0, gt=0)


class SlurmInfra(InfraPlugin):
    """A Slurm cluster: one sbatch job per run (torchrun on every node), followed from the terminal."""

    name = "slurm"
    api = ">=3.0,<4"
    Config = SlurmConfig

    def world(self, cfg: SlurmConfig) -> World:
        """Processes from the settings; the nodes cannot be inspected from here."""
        from olmx.launch.devices import gpu_compute_capability, gpu_memory_gib

        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (cfg.gpus_per_node or 2)
        if cfg.gpus_per_node and nproc > cfg.gpus_per_node:
            raise ConfigError(
                "infra.nproc_per_node", f"{nproc} processes per node but infra.gpus_per_node={cfg.gpus_per_node}"
            )
        _check(cfg)
        # Every setting that lands in the script is checked now, before anything is written.
        _render(cfg, run_dir="/olmx-check", plan_path="/olmx-check/plan.yaml", nproc_per_node=nproc)
        if not cfg.gpus_per_node:
            return World(nnodes=cfg.nodes, nproc_per_node=nproc)
        name = cfg.gpu_name or "cuda"
        return World(
            nnodes=cfg.nodes,
            nproc_per_node=nproc,
            device="cuda",
            device_name=name,
            compute_capability=gpu_compute_capability(name),
            device_memory_gib=gpu_memory_gib(name),
        )

    # -- the batch script ------------------------------------------------------------------

    def script(self, cfg: SlurmConfig, plan: Any) -> str:
        """The exact batch script of the run."""
        return _render(
            cfg, run_dir=plan.run_dir, plan_path=str(plan.plan_path), nproc_per_node=plan.world.nproc_per_node
        )

    def dry_run(self, cfg: SlurmConfig, plan: Any) -> str:
        """The batch script, exactly as it would be written to ``RUN_DIR/sbatch.sh`` and
        submitted with ``sbatch --parsable``."""
        return self.script(cfg, plan)

    def reports_here(self, cfg: SlurmConfig) -> bool:
        """Not for a detached job: it has not run yet."""
        return not cfg.detach

    # -- launching and following -----------------------------------------------------------

    def launch(self, cfg: SlurmConfig, plan: Any) -> int:
        """Submit the job and follow it (or return at once with ``infra.detach``)."""
        from olmx.console import make_console
        from olmx_plugins.infra.slurm import jobs

        script = self.script(cfg, plan)
        submitted = time.time()
        job_id = jobs.submit(script, run_dir=plan.run_dir, filename=SCRIPT_FILE)
        log = jobs.log_path(job_id, plan.run_dir)
        RunDir(plan.run_dir).write_launch(
            {
                "infra": self.name,
                "job_id": job_id,
                "log": str(log),
                "script": str(Path(plan.run_dir) / SCRIPT_FILE),
                "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        out = make_console()
        out.print(f"Submitted Slurm job [bold]{job_id}[/]; its log: {log}")
        if cfg.detach:
            out.print(
                f"Detached. Follow it with: olmx jobs status {plan.run_dir}  |  "
                f"olmx jobs logs {plan.run_dir}  |  olmx jobs cancel {plan.run_dir}"
            )
            return 0
        return self._follow(plan, job_id, cfg, make_console(stderr=True), since=submitted)

    def _follow(self, plan: Any, job_id: str, cfg: SlurmConfig, console: Any, since: float = 0.0) -> int:
        """Follow the job to its end. On one node its log holds torchrun's failure lines, read
        as a local launch reads them (:class:`olmx.launch.failures.FailureRecorder`): which rank
        failed and why goes to ``events.jsonl`` (``rank_failed``) as it happens, and a restart
        is said. (On several nodes their lines mix in one log: each node's rank is not told.)"""
        from olmx.launch.failures import FailureRecorder
        from olmx.launch.monitor import follow
        from olmx_plugins.infra.slurm import jobs

        log = jobs.log_path(job_id, plan.run_dir)
        watch = _JobWatch(job_id, cfg.poll_seconds, requeue=cfg.requeue, say=console.print)
        one_node = plan.world.nnodes == 1
        recorder = FailureRecorder(plan.run_dir, log, offset=0, since=since, node_rank=0, launch=f"slurm-{job_id}")

        def poll() -> int | None:
            rc = watch.poll()
            if one_node:
                recorder.poll()
            return rc

        try:
            with console.status(f"Slurm job {job_id}: submitted") as status:
                start = time.monotonic()
                while watch.queued():
                    status.update(f"Slurm job {job_id}: {watch.line()} ({time.monotonic() - start:.0f} s)")
                    time.sleep(0.2)
            rc = follow(plan, poll, log_path=log, console=console, interval=0.5)
            for failure in recorder.failures:
                console.print(f"[yellow]restarted[/] after {failure.describe()}")
            return rc
        except KeyboardInterrupt:
            raise self._interrupted(plan, job_id, console) from None
        except RunFailed as exc:
            state = watch.state or "ended"
            raise RunFailed(
                f"Slurm job {job_id} ended {state} with exit code {exc.exit_code}; "
                f"last lines of {log}:\n{tail(log, 30)}",
                exc.exit_code,
            ) from None

    def _interrupted(self, plan: Any, job_id: str, console: Any) -> RunFailed:
        """Ctrl-C while following: cancel only when a person on a terminal says so."""
        from olmx_plugins.infra.slurm import jobs

        cancel = False
        if sys.stdin is not None and sys.stdin.isatty():
            from rich.prompt import Confirm

            try:
                cancel = Confirm.ask(f"\nCancel Slurm job {job_id}?", default=False, console=console)
            except (KeyboardInterrupt, EOFError):
                cancel = False
        if cancel:
            jobs.cancel(job_id)
            return RunFailed(
                f"cancelled Slurm job {job_id}; run the same command again to resume "
                f"from its last checkpoint in {plan.run_dir}",
                130,
            )
        return RunFailed(
            f"stopped following; Slurm job {job_id} keeps running. Status: olmx jobs status {plan.run_dir}; "
            f"log: olmx jobs logs {plan.run_dir}; cancel: olmx jobs cancel {plan.run_dir} (or scancel {job_id})",
            130,
        )

    # -- olmx jobs ---------------------------------------------------------------------------

    def job_status(self, cfg: SlurmConfig, plan: Any) -> str:
        """The job's Slurm state, its last metrics record and where its log is."""
        from olmx_plugins.infra.slurm import jobs

        record = RunDir(plan.run_dir).read_launch("Slurm")
        job_id = record["job_id"]
        try:
            details = jobs.job_details(job_id)
            state = details["JobState"]
            reason = details.get("Reason", "None")
            extra = [f"reason {reason}"] if state == "PENDING" and reason != "None" else []
            extra += [f"nodes {details['NodeList']}"] if details.get("NodeList", "(null)") != "(null)" else []
            extra += [f"run time {details['RunTime']}"] if "RunTime" in details else []
            restarts = details.get("Restarts", "0")
            extra += [f"requeued {restarts} time(s)"] if restarts.isdigit() and int(restarts) else []
            extra += [f"held: scontrol release {job_id}"] if state in jobs.HELD_STATES else []
            extra += [f"exit code {details['ExitCode']}"] if state in jobs.TERMINAL_STATES else []
            line = f"Slurm job {job_id}: {state}" + (f" ({', '.join(extra)})" if extra else "")
        except jobs.SlurmError as exc:
            line = f"Slurm job {job_id}: state unknown ({exc})"
        from olmx.launch.monitor import progress_line

        return "\n".join([line, progress_line(plan), f"log: {record['log']}"])

    def job_logs(self, cfg: SlurmConfig, plan: Any, lines: int) -> str:
        """The last ``lines`` lines of the job's log."""
        record = RunDir(plan.run_dir).read_launch("Slurm")
        text = tail(record["log"], lines)
        return text or f"(the log {record['log']} is empty or not written yet)"

    def job_cancel(self, cfg: SlurmConfig, plan: Any) -> None:
        """Cancel the job (``scancel``); says so when it has already ended."""
        from olmx_plugins.infra.slurm import jobs

        job_id = RunDir(plan.run_dir).read_launch("Slurm")["job_id"]
        state = jobs.job_state(job_id)
        if state in jobs.TERMINAL_STATES and not (cfg.requeue and state in jobs.REQUEUABLE_STATES):
            raise LaunchError(f"Slurm job {job_id} has already ended ({state}); nothing to cancel")
        jobs.cancel(job_id)


class _JobWatch:
    """Asks Slurm about one job at most every ``every`` seconds; remembers the answers. With
    ``requeue`` the job is followed through its requeues (:class:`jobs.JobEnd`); ``say``
    is told, in one line each, of a requeue, a hold and a wait for one."""

    def __init__(
        self, job_id: str, every: float, *, requeue: bool = False, say: Callable[[str], object] | None = None
    ) -> None:
        from olmx_plugins.infra.slurm import jobs

        self.job_id, self.every = job_id, every
        self.state: str | None = None
        self.reason = ""
        self.restarts = 0
        self._end = jobs.JobEnd(requeue=requeue)
        self._say = say or (lambda line: None)
        self._asked = float("-inf")
        self._code: int | None = None

    def _ask(self) -> None:
        from olmx_plugins.infra.slurm import jobs

        if time.monotonic() - self._asked < self.every:
            return
        self._asked = time.monotonic()
        details = jobs.job_details(self.job_id)
        state, self.reason = details["JobState"], details.get("Reason", "None")
        restarts = details.get("Restarts", "0")
        if restarts.isdigit() and int(restarts) > self.restarts:
            self.restarts = int(restarts)
            self._say(
                f"Slurm job {self.job_id} was requeued (restart {self.restarts}); "
                "it resumes from its last checkpoint when it runs again"
            )
        if state != self.state:
            if state in jobs.HELD_STATES:
                self._say(
                    f"Slurm job {self.job_id} is {state} (reason {self.reason}): Slurm holds it until "
                    f"`scontrol release {self.job_id}`; Ctrl-C stops following"
                )
            elif self._end.requeue and state in jobs.REQUEUABLE_STATES:
                self._say(
                    f"Slurm job {self.job_id} is {state}; waiting up to {self._end.grace:g} s for Slurm to requeue it"
                )
        self.state = state
        if self._end.final(state):
            code = jobs.job_exit_code(details)
            self._code = 0 if state == "COMPLETED" else (code or 1)

    def queued(self) -> bool:
        """True while the job waits for nodes (PENDING, CONFIGURING, ...)."""
        self._ask()
        return self.state not in ("RUNNING", "COMPLETING") and self._code is None

    def line(self) -> str:
        """The state for the status line."""
        return (self.state or "?") + (f", reason {self.reason}" if self.reason not in ("", "None") else "")

    def poll(self) -> int | None:
        """None while the job is queued, runs or may still be requeued, then its exit code
        (0 only for COMPLETED)."""
        self._ask()
        return self._code


def _check(cfg: SlurmConfig) -> None:
    """ConfigError, naming the key, for settings that do not fit together."""
    from olmx_plugins.infra.slurm import jobs

    if cfg.container_image is not None:
        raise ConfigError(
            "infra.container_image",
            "replaced by infra.container.image (with infra.container.runtime=pyxis, apptainer or singularity)",
        )
    if cfg.container_mounts is not None:
        raise ConfigError(
            "infra.container_mounts", "replaced by infra.container.mounts, a list: infra.container.mounts=[/src:/dst]"
        )
    if cfg.gpu_type is not None and not cfg.gpus_per_node:
        raise ConfigError("infra.gpu_type", f"'{cfg.gpu_type}' set, but infra.gpus_per_node=0 asks for no GPUs")
    if not cfg.exclusive and cfg.cpus_per_task is None:
        raise ConfigError(
            "infra.cpus_per_task",
            "with infra.exclusive=false set the CPUs of each node's task (torchrun and its workers), "
            "e.g. infra.cpus_per_task=16; else Slurm gives it one CPU",
        )
    for arg in cfg.extra_sbatch_args:
        name = arg.split("=", 1)[0]
        instead = OWN_OPTIONS.get(name)
        if name == "--exclusive" and arg != name and not cfg.exclusive:
            instead = None  # --exclusive=user|mcs|topo on nodes olmx does not ask to have alone
        if name == "--gres" and any(g.startswith("gpu") for g in arg.partition("=")[2].split(",")):
            instead = "infra.gpus_per_node with infra.gpu_request=gres (and infra.gpu_type)"
        if name in ("--mem-per-cpu", "--mem-per-gpu") and cfg.mem is not None:
            instead = "infra.mem alone (Slurm takes one of --mem, --mem-per-cpu, --mem-per-gpu)"
        if instead is not None:
            raise ConfigError("infra.extra_sbatch_args", f"'{arg}' is set by olmx: use {instead}")
    if cfg.signal_seconds is not None and cfg.signal_seconds < cfg.stop_timeout:
        raise ConfigError(
            "infra.signal_seconds",
            f"{cfg.signal_seconds} s is less than infra.stop_timeout={cfg.stop_timeout} s, the time the workers "
            f"get to save a checkpoint after SIGTERM; set at least {cfg.stop_timeout} (null: "
            f"{cfg.stop_timeout + SIGNAL_MARGIN_S}) or lower infra.stop_timeout",
        )
    try:
        limit = jobs.time_limit_seconds(cfg.time)
    except jobs.SlurmError as exc:
        raise ConfigError("infra.time", str(exc).removeprefix("slurm time=")) from None
    signal = _signal_seconds(cfg)
    if limit is not None and signal >= limit:
        given = "" if cfg.signal_seconds is not None else f" (infra.stop_timeout + {SIGNAL_MARGIN_S})"
        raise ConfigError(
            "infra.signal_seconds",
            f"{signal} s{given} is not shorter than infra.time={cfg.time} ({limit} s): the job would be told "
            "to stop as soon as it starts; raise infra.time or lower infra.stop_timeout",
        )


def _signal_seconds(cfg: SlurmConfig) -> int:
    return cfg.signal_seconds if cfg.signal_seconds is not None else cfg.stop_timeout + SIGNAL_MARGIN_S


#: render_sbatch's argument names that are not ``infra.<same name>``.
_KEYS = {
    "run_dir": "trainer.run_dir",
    "workdir": "trainer.run_dir",
    "container_runtime": "infra.container.runtime",
    "container_image": "infra.container.image",
    "container_mounts": "infra.container.mounts",
    "container_env": "infra.container.env",
}


def _render(cfg: SlurmConfig, *, run_dir: str, plan_path: str, nproc_per_node: int) -> str:
    """The batch script; a value that would not survive it is a ConfigError naming its key."""
    from olmx.launch import torchrun_flags, worker_command
    from olmx_plugins.infra.slurm import jobs

    python = cfg.python or ("python" if cfg.container.image else sys.executable)
    mem = cfg.mem
    if (
        mem is None
        and cfg.exclusive
        and not any(a.startswith(("--mem-per-cpu", "--mem-per-gpu")) for a in cfg.extra_sbatch_args)
    ):
        mem = "0"  # --exclusive gives a job all of a node's CPUs but only the memory it asks for
    try:
        return jobs.render_sbatch(
            run_dir=run_dir,
            command=worker_command(plan_path, python=python),
            nproc_per_node=nproc_per_node,
            nodes=cfg.nodes,
            python=python,
            job_name=cfg.job_name,
            partition=cfg.partition,
            account=cfg.account,
            time=cfg.time,
            gpus_per_node=cfg.gpus_per_node or None,
            gpu_type=cfg.gpu_type,
            gpu_request=cfg.gpu_request,
            cpus_per_task=cfg.cpus_per_task,
            exclusive=cfg.exclusive,
            mem=mem,
            signal_seconds=_signal_seconds(cfg),
            requeue=cfg.requeue,
            max_requeues=cfg.max_requeues,
            container_runtime=cfg.container.runtime,
            container_image=cfg.container.image,
            container_mounts=cfg.container.mounts,
            container_env=cfg.container.env,
            env={**torchrun_env(cfg), **cfg.env},
            extra_sbatch_args=cfg.extra_sbatch_args,
            torchrun_flags=torchrun_flags(cfg, run_dir),
        )
    except jobs.SlurmError as exc:  # "slurm <argument>...: why"
        text = str(exc).removeprefix("slurm ")
        arg = text.split("=")[0].split(":")[0].split()[0]
        raise ConfigError(_KEYS.get(arg, f"infra.{arg}"), text) from None


SLURM = SlurmInfra()
