"""A Slurm cluster: one sbatch job per run (torchrun on every node), followed from the terminal.

``olmx train infra=slurm ...`` renders ``templates/slurm/sbatch.sh.j2`` (one srun task per node,
each running torchrun; the torchruns meet in a c10d rendezvous on the first node), writes it
to ``RUN_DIR/sbatch.sh``, submits it with ``sbatch`` and records the job in
``RUN_DIR/launch.json``. It then shows the queue state on a status line, and once the job
runs, the progress bar drawn from ``RUN_DIR/metrics.jsonl`` (the run directory must be on
storage that the login node and the compute nodes share). Ctrl-C asks whether to cancel the
job; without a terminal to ask on, the job keeps running and olmx prints how to reach it.
``infra.detach=true`` submits and returns; ``olmx jobs status|logs|cancel RUN_DIR`` work on
the job later.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from olmx.api import InfraPlugin, World
from olmx.errors import ConfigError, LaunchError, RunFailed
from olmx.launch import TorchrunConfig, torchrun_env
from olmx.rundir import RunDir, tail

#: File in the run directory that holds the submitted batch script.
SCRIPT_FILE = "sbatch.sh"


@dataclass
class SlurmConfig(TorchrunConfig):
    """Settings of ``infra=slurm``."""

    #: Nodes of the job (``--nodes``); one torchrun runs on each.
    nodes: int = 1
    #: GPUs per node (``--gpus-per-node``); 0 trains on CPUs.
    gpus_per_node: int = 0
    #: Worker processes per node; null means one per GPU, or 2 CPU processes.
    nproc_per_node: Optional[int] = None
    #: GPU model of the nodes (e.g. ``NVIDIA H100 80GB HBM3``): shown in the plan, and its
    #: compute capability is what the precision plugins check (e.g. MXFP8 needs SM100).
    gpu_name: Optional[str] = None
    #: Slurm partition (``--partition``); null: the cluster's default.
    partition: Optional[str] = None
    #: Account to charge (``--account``).
    account: Optional[str] = None
    #: Time limit in Slurm's syntax (``02:00:00``, ``1-00:00:00``) or minutes.
    time: Optional[str] = None
    #: CPUs of each node's task (``--cpus-per-task``): torchrun and all its workers.
    cpus_per_task: Optional[int] = None
    #: Memory per node (``--mem``, e.g. ``500G``).
    mem: Optional[str] = None
    #: Run each node's task in this container image (pyxis ``--container-image``).
    container_image: Optional[str] = None
    #: pyxis ``--container-mounts`` (``/src:/dst,...``); the run directory must be inside one.
    container_mounts: Optional[str] = None
    #: SIGTERM the job this many seconds before its time limit, so that the workers can save
    #: a checkpoint (``--signal=B:TERM@N``).
    signal_seconds: Optional[int] = None
    #: Let Slurm requeue the job (pre-emption, node failure); it resumes from its last
    #: checkpoint in the same run directory.
    requeue: bool = False
    #: Submit, print the job id and return at once (then ``olmx jobs status RUN_DIR``).
    detach: bool = False
    #: Python on the nodes that runs torchrun and ``olmx run`` (it needs olmx installed);
    #: null: the Python running this olmx (right when the environment is on shared storage).
    python: Optional[str] = None
    #: Extra environment variables of the job. They are written into the plan and the batch
    #: script, so no secrets here: the job inherits the submitting shell's environment anyway.
    env: dict[str, str] = field(default_factory=dict)
    #: Slurm job name.
    job_name: str = "olmx"
    #: Further ``#SBATCH`` options, each one ``--name=value`` word (``--qos=high``).
    extra_sbatch_args: list[str] = field(default_factory=list)
    #: Seconds between two questions to Slurm while following the job.
    poll_seconds: float = 5.0


class SlurmInfra(InfraPlugin):
    """A Slurm cluster: one sbatch job per run (torchrun on every node), followed from the terminal."""

    name = "slurm"
    description = __doc__.splitlines()[0]
    api = ">=2.0,<3"
    Config = SlurmConfig

    def world(self, cfg: SlurmConfig) -> World:
        """Processes from the settings; the nodes cannot be inspected from here."""
        from olmx.launch.devices import gpu_compute_capability

        if cfg.nodes < 1:
            raise ConfigError("infra.nodes", f"must be at least 1, got {cfg.nodes}")
        if cfg.gpus_per_node < 0:
            raise ConfigError("infra.gpus_per_node", f"must be 0 (CPU) or more, got {cfg.gpus_per_node}")
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (cfg.gpus_per_node or 2)
        if nproc < 1:
            raise ConfigError("infra.nproc_per_node", f"must be at least 1, got {nproc}")
        if cfg.gpus_per_node and nproc > cfg.gpus_per_node:
            raise ConfigError(
                "infra.nproc_per_node", f"{nproc} processes per node but infra.gpus_per_node={cfg.gpus_per_node}"
            )
        if cfg.poll_seconds <= 0:
            raise ConfigError("infra.poll_seconds", f"must be positive, got {cfg.poll_seconds}")
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
        from rich.console import Console

        from olmx_plugins.infra.slurm import jobs

        script = self.script(cfg, plan)
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
        out = Console(highlight=False, soft_wrap=True)
        out.print(f"Submitted Slurm job [bold]{job_id}[/]; its log: {log}")
        if cfg.detach:
            out.print(
                f"Detached. Follow it with: olmx jobs status {plan.run_dir}  |  "
                f"olmx jobs logs {plan.run_dir}  |  olmx jobs cancel {plan.run_dir}"
            )
            return 0
        return self._follow(plan, job_id, cfg, Console(stderr=True, highlight=False, soft_wrap=True))

    def _follow(self, plan: Any, job_id: str, cfg: SlurmConfig, console: Any) -> int:
        from olmx.launch.monitor import follow
        from olmx_plugins.infra.slurm import jobs

        log = jobs.log_path(job_id, plan.run_dir)
        watch = _JobWatch(job_id, cfg.poll_seconds)
        try:
            with console.status(f"Slurm job {job_id}: submitted") as status:
                start = time.monotonic()
                while watch.queued():
                    status.update(f"Slurm job {job_id}: {watch.line()} ({time.monotonic() - start:.0f} s)")
                    time.sleep(0.2)
            return follow(plan, watch.poll, log_path=log, console=console, interval=0.5)
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
        if state in jobs.TERMINAL_STATES:
            raise LaunchError(f"Slurm job {job_id} has already ended ({state}); nothing to cancel")
        jobs.cancel(job_id)


class _JobWatch:
    """Asks Slurm about one job at most every ``every`` seconds; remembers the answers."""

    def __init__(self, job_id: str, every: float) -> None:
        self.job_id, self.every = job_id, every
        self.state: str | None = None
        self.reason = ""
        self._asked = float("-inf")
        self._code: int | None = None

    def _ask(self) -> None:
        from olmx_plugins.infra.slurm import jobs

        if time.monotonic() - self._asked < self.every:
            return
        self._asked = time.monotonic()
        details = jobs.job_details(self.job_id)
        self.state, self.reason = details["JobState"], details.get("Reason", "None")
        if self.state in jobs.TERMINAL_STATES:
            code = jobs.job_exit_code(details)
            self._code = 0 if self.state == "COMPLETED" else (code or 1)

    def queued(self) -> bool:
        """True while the job waits for nodes (PENDING, CONFIGURING, ...)."""
        self._ask()
        return self.state not in ("RUNNING", "COMPLETING") and self._code is None

    def line(self) -> str:
        """The state for the status line."""
        return (self.state or "?") + (f", reason {self.reason}" if self.reason not in ("", "None") else "")

    def poll(self) -> int | None:
        """None while the job runs, then its exit code (0 only for COMPLETED)."""
        self._ask()
        return self._code


def _render(cfg: SlurmConfig, *, run_dir: str, plan_path: str, nproc_per_node: int) -> str:
    """The batch script; a value that would not survive it is a ConfigError naming its key."""
    from olmx.launch import torchrun_flags, worker_command
    from olmx_plugins.infra.slurm import jobs

    python = cfg.python or sys.executable
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
            cpus_per_task=cfg.cpus_per_task,
            mem=cfg.mem,
            signal_seconds=cfg.signal_seconds,
            requeue=cfg.requeue,
            container_image=cfg.container_image,
            container_mounts=cfg.container_mounts,
            env={**torchrun_env(cfg), **cfg.env},
            extra_sbatch_args=cfg.extra_sbatch_args,
            torchrun_flags=torchrun_flags(cfg, run_dir),
        )
    except jobs.SlurmError as exc:  # "slurm <argument>...: why"
        text = str(exc).removeprefix("slurm ")
        arg = text.split("=")[0].split(":")[0].split()[0]
        key = "trainer.run_dir" if arg in ("run_dir", "workdir") else f"infra.{arg}"
        raise ConfigError(key, text) from None


SLURM = SlurmInfra()
