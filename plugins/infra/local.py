"""This machine (or several, by hand): torchrun starts the processes; progress in the terminal.

The launcher owns what it started: torchrun runs in a session of its own with the
parent-death signal set (Linux ``PR_SET_PDEATHSIG=SIGTERM``), so when ``olmx train`` dies,
even by SIGKILL, torchrun passes SIGTERM on to its workers, which finish their step, save a
checkpoint and exit (75); the workers set the same signal against torchrun. SIGTERM, SIGHUP
(a closed terminal, a dropped SSH session) and Ctrl-C to ``olmx train`` stop the run the same
way. The launch is recorded in ``RUN_DIR/launch.json`` (host, pids, start), which ``olmx jobs
status|logs|cancel RUN_DIR`` read.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from olmx.api import InfraPlugin, World, setting
from olmx.errors import ConfigError, RunFailed
from olmx.launch import TorchrunConfig, threads_env, torchrun_env
from olmx.rundir import RunDir


@dataclass(frozen=True)
class LocalConfig(TorchrunConfig):
    """Settings of ``infra=local``."""

    #: Processes on this machine: one per GPU; null means all GPUs, or 2 CPU processes.
    nproc_per_node: Optional[int] = setting(None, ge=1, integer=True)
    #: Machines taking part (start ``olmx run`` the same way on each, see README).
    nnodes: int = setting(1, ge=1)
    #: This machine's rank among ``nnodes``.
    node_rank: int = setting(0, ge=0)
    #: Address of node 0 (rendezvous), used when ``nnodes > 1``.
    master_addr: str = "127.0.0.1"
    #: Rendezvous port on node 0, used when ``nnodes > 1``.
    master_port: int = setting(29500, ge=1, le=65535)


def _crowded(kind: str, nproc: int) -> tuple[str, ...]:
    """A warning when CPU processes outnumber this machine's cores (each gets one thread)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if kind != "cpu" or nproc <= cores:
        return ()
    return (
        f"{nproc} CPU processes on {cores} core(s): they share the cores (one thread each), so a step is no "
        f"faster than with {cores} process(es) and adds communication between them (infra.nproc_per_node={cores})",
    )


def _share(total: float | None, nproc: int) -> float | None:
    """Each CPU process's share of this machine's RAM."""
    return None if total is None else total / nproc


class LocalInfra(InfraPlugin):
    """Runs torchrun on this machine and follows the run from the terminal."""

    name = "local"
    api = ">=3.0,<4"
    Config = LocalConfig

    def world(self, cfg: LocalConfig) -> World:
        """Processes from the settings and the GPUs ``nvidia-smi`` sees."""
        from olmx.launch.devices import host_memory_gib, local_devices

        dev = local_devices()
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (dev.count or 2)
        if dev.kind == "cuda" and nproc > dev.count:
            raise ConfigError("infra.nproc_per_node", f"{nproc} processes but this machine has {dev.count} GPU(s)")
        if cfg.node_rank >= cfg.nnodes:
            raise ConfigError("infra.node_rank", f"{cfg.node_rank} must be in [0, infra.nnodes={cfg.nnodes})")
        return World(
            nnodes=cfg.nnodes,
            nproc_per_node=nproc,
            device=dev.kind,
            device_name=dev.name,
            compute_capability=dev.compute_capability,
            device_memory_gib=dev.memory_gib if dev.kind == "cuda" else _share(host_memory_gib(), nproc),
            warnings=_crowded(dev.kind, nproc),
        )

    def command(self, cfg: LocalConfig, plan: Any) -> list[str]:
        """The torchrun command line for this node."""
        from olmx.launch import torchrun_command

        endpoint = None if cfg.nnodes == 1 else f"{cfg.master_addr}:{cfg.master_port}"
        return torchrun_command(
            plan,
            cfg,
            nnodes=cfg.nnodes,
            nproc_per_node=plan.world.nproc_per_node,
            node_rank=cfg.node_rank,
            rdzv_endpoint=endpoint,
        )

    def dry_run(self, cfg: LocalConfig, plan: Any) -> str:
        """The exact command that would run."""
        from olmx.launch import shell_join

        return shell_join([f"{k}={v}" for k, v in torchrun_env(cfg).items()] + self.command(cfg, plan))

    def reports_here(self, cfg: LocalConfig) -> bool:
        """Node 0's launcher writes the report (once per run)."""
        return cfg.node_rank == 0

    def owns_run_dir(self, cfg: LocalConfig) -> bool:
        """Node 0's launcher takes the run directory's lock; the others share the directory."""
        return cfg.node_rank == 0

    def launch(self, cfg: LocalConfig, plan: Any) -> int:
        """Start torchrun with its output in ``RUN_DIR/logs/``, follow it, and end as the run
        did: 0 when it finished; otherwise :class:`RunFailed` with the exit code of
        :mod:`olmx.events` (75: stopped by a signal with a checkpoint, 76: stopped on a
        non-finite loss) or, when processes died, the rank that died first and its log tail.

        SIGTERM or SIGHUP to this process (a scheduler taking the machine, a closed terminal)
        is passed on to torchrun and its processes, which finish their step and save a
        checkpoint; Ctrl-C does the same (once: a repeated Ctrl-C waits on with them); if this
        process dies, torchrun gets SIGTERM."""
        import socket
        import time
        import uuid

        from olmx.console import make_console
        from olmx.events import LAUNCH_ENV, LAUNCH_TIME_ENV
        from olmx.launch import parent_death_preexec
        from olmx.launch.failures import FailureRecorder
        from olmx.launch.monitor import follow
        from olmx.rundir import process_start

        log_path = RunDir(plan.run_dir).node_log(cfg.node_rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        launch_id, started = uuid.uuid4().hex[:12], time.time()
        env = {**torchrun_env(cfg), **threads_env(os.environ), **os.environ, LAUNCH_ENV: launch_id}
        env[LAUNCH_TIME_ENV] = repr(started)
        console = make_console(stderr=True)
        interrupted = False
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command(cfg, plan),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=parent_death_preexec(signal.SIGTERM),
                env=env,
            )
            if self.owns_run_dir(cfg):
                RunDir(plan.run_dir).write_launch(
                    {
                        "infra": self.name,
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "pid_start": process_start(os.getpid()),
                        "torchrun_pid": proc.pid,
                        "torchrun_start": process_start(proc.pid),
                        "launch_id": launch_id,
                        "node_rank": cfg.node_rank,
                        "log": str(log_path),
                        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    }
                )

            def pass_on(signum: int, frame: Any) -> None:
                os.killpg(proc.pid, signum)  # first: after a SIGHUP the terminal may be gone
                try:
                    console.print(
                        f"{signal.Signals(signum).name}: stopping the run at the end of this step "
                        f"(a checkpoint is saved)..."
                    )
                except OSError:
                    pass

            recorder = FailureRecorder(
                plan.run_dir, log_path, offset=offset, since=started, node_rank=cfg.node_rank, launch=launch_id
            )

            def poll() -> int | None:
                rc = proc.poll()
                recorder.poll()  # a restart's cause is recorded when it happens
                return rc

            stopping = False

            def interrupt(signum: int, frame: Any) -> None:
                """Ctrl-C: the first one ends following (KeyboardInterrupt, below), a repeated one
                only says that the processes are still saving: olmx train never returns (nor
                releases the run directory's lock) while they run."""
                nonlocal stopping
                if stopping:
                    try:
                        console.print("still stopping: the processes finish their step and save a checkpoint...")
                    except OSError:
                        pass
                    return
                stopping = True
                raise KeyboardInterrupt

            previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
            try:
                try:
                    follow(plan, poll, log_path=log_path, console=console)
                    rc = 0
                except RunFailed as exc:
                    rc = exc.exit_code
                except KeyboardInterrupt:
                    interrupted = stopping = True
                    pass_on(signal.SIGINT, None)
                    rc = proc.wait()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return self._conclude(
            plan,
            cfg,
            launch_id=launch_id,
            rc=rc,
            started=started,
            log_path=log_path,
            offset=offset,
            interrupted=interrupted,
            console=console,
            recorder=recorder,
        )

    def _conclude(
        self,
        plan: Any,
        cfg: LocalConfig,
        *,
        launch_id: str,
        rc: int,
        started: float,
        log_path: Path,
        offset: int,
        interrupted: bool,
        console: Any,
        recorder: Any,
    ) -> int:
        """Record the rank failures of this launch not yet recorded in ``events.jsonl`` and
        turn its outcome into the return value or a :class:`RunFailed`."""
        from olmx.events import EXIT_HANG, hang_message, outcome, read_events

        failures = recorder.poll()
        # On several nodes global rank 0 (which writes the run's records) may be on any node, its
        # launcher's id unknown here: this launch's records are those written since it started.
        mine = launch_id if cfg.nnodes == 1 else None
        events = read_events(plan.run_dir, launch=mine, since=started)
        result = outcome(plan.run_dir, launch=mine, since=started, returncode=rc)
        hung = next((e for e in reversed(events) if e["event"] == "hang"), None) if result.state == "hang" else None
        for e in events:
            if e["event"] == "fresh" and e.get("moved_to"):
                console.print(
                    f"trainer.resume=false: the earlier checkpoints were moved to {e['moved_to']}", highlight=False
                )
            if e["event"] == "hang" and e is not hung:
                console.print(f"[yellow]restarted[/] after a {hang_message(e)}", highlight=False)
            if e["event"] == "checkpoint_corrupt":
                console.print(
                    f"[yellow]checkpoint step {e['step']} was corrupt[/] ({e['problem']}); "
                    f"moved to {e['moved_to']}, an older one was used",
                    highlight=False,
                )
        # (a rank's planned exit, 75/76/77, is no failure: the recorder leaves it out)
        restarts = failures if result.state != "failed" else failures[:-1]
        hung_attempts = {e.get("attempt") for e in events if e["event"] == "hang"}
        for failure in restarts:
            if failure.attempt not in hung_attempts:  # (said above, with the hang's verdict)
                console.print(f"[yellow]restarted[/] after {failure.describe()}")
        if result.state == "complete":
            return 0
        resume = f"run the same olmx train again (trainer.run_dir={plan.run_dir}) to resume"
        if result.state == "stopped":
            raise RunFailed(
                f"{'interrupted, ' if interrupted else ''}{result.message}: {resume}",
                130 if interrupted else result.exit_code,
            )
        if result.state == "hang":
            raise RunFailed(
                f"{result.message}; no restarts left (infra.max_restarts={cfg.max_restarts}): {resume}", EXIT_HANG
            )
        if result.state == "nonfinite":
            raise RunFailed(
                f"{result.message}; then {resume}",
                result.exit_code,
            )
        if failures:
            last = failures[-1]
            where = f" ({last.log})" if last.log else ""
            raise RunFailed(
                f"training failed: {last.describe()}; no restarts left "
                f"(infra.max_restarts={cfg.max_restarts}). Last lines of its log{where}:\n{last.tail}",
                rc or 1,
            )
        from olmx.events import EXIT_PREEMPTED
        from olmx.launch.failures import log_excerpt

        if rc < 0:  # torchrun itself ended by a signal (before it could pass it on): stopped, resume me
            name = signal.Signals(-rc).name  # (a Ctrl-C: 130, as every Ctrl-C)
            raise RunFailed(
                f"{'interrupted, ' if interrupted else ''}torchrun was ended by {name} before its processes saved "
                f"anything; {resume}",
                130 if interrupted else EXIT_PREEMPTED,
            )
        raise RunFailed(
            f"training failed with exit code {rc}; from {log_path}:\n{log_excerpt(log_path, since=offset)}", rc or 1
        )

    # -- olmx jobs ---------------------------------------------------------------------------

    def _record(self, plan: Any) -> dict[str, Any]:
        record = RunDir(plan.run_dir).read_launch("local")
        if record.get("infra") != self.name:
            raise ConfigError("RUN_DIR", f"{plan.run_dir} was launched on {record.get('infra')}, not locally")
        return record

    def _alive(self, record: dict[str, Any]) -> dict[str, bool] | None:
        """Which of the recorded processes run (None: recorded on another host)."""
        import socket

        from olmx.rundir import process_alive

        if record.get("host") != socket.gethostname():
            return None
        return {
            "launcher": process_alive(record["pid"], record.get("pid_start")),
            "torchrun": process_alive(record["torchrun_pid"], record.get("torchrun_start")),
        }

    def job_status(self, cfg: LocalConfig, plan: Any) -> str:
        """Whether the launch recorded in ``launch.json`` still runs, and its progress line."""
        from olmx.events import outcome
        from olmx.launch.monitor import progress_line

        record = self._record(plan)
        alive = self._alive(record)
        where = f"local run on {record['host']} (olmx train pid {record['pid']}, torchrun pid {record['torchrun_pid']})"
        if alive is None:
            state = "state unknown: launched on another host"
        elif any(alive.values()):
            state = "alive" + ("" if alive["launcher"] else " (its olmx train is gone; torchrun is stopping)")
        else:
            state = f"ended: {outcome(plan.run_dir, launch=record.get('launch_id')).message}"
        return "\n".join(
            [f"{where}, started {record['started']}: {state}", progress_line(plan), f"log: {record['log']}"]
        )

    def job_logs(self, cfg: LocalConfig, plan: Any, lines: int) -> str:
        """The last ``lines`` lines of the node log."""
        from olmx.rundir import tail

        record = self._record(plan)
        return tail(record["log"], lines) or f"(the log {record['log']} is empty or not written yet)"

    def job_cancel(self, cfg: LocalConfig, plan: Any) -> None:
        """SIGTERM to the launcher (it passes it on) or, if it is gone, to torchrun's process
        group: the workers finish their step, save a checkpoint and exit."""
        from olmx.errors import LaunchError

        record = self._record(plan)
        alive = self._alive(record)
        if alive is None:
            raise LaunchError(f"the run was launched on {record['host']}: run olmx jobs cancel there")
        if alive["launcher"]:
            os.kill(record["pid"], signal.SIGTERM)
        elif alive["torchrun"]:
            os.killpg(record["torchrun_pid"], signal.SIGTERM)
        else:
            raise LaunchError(f"the run in {plan.run_dir} has already ended; nothing to cancel")


LOCAL = LocalInfra()
