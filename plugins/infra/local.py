"""This machine (or several, by hand): torchrun starts the processes; progress in the terminal."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from olmx.api import InfraPlugin, World
from olmx.errors import ConfigError, RunFailed
from olmx.launch import TorchrunConfig, torchrun_env
from olmx.rundir import RunDir


@dataclass
class LocalConfig(TorchrunConfig):
    """Settings of ``infra=local``."""

    #: Processes on this machine: one per GPU; null means all GPUs, or 2 CPU processes.
    nproc_per_node: Optional[int] = None
    #: Machines taking part (start ``olmx run`` the same way on each, see README).
    nnodes: int = 1
    #: This machine's rank among ``nnodes``.
    node_rank: int = 0
    #: Address of node 0 (rendezvous), used when ``nnodes > 1``.
    master_addr: str = "127.0.0.1"
    #: Rendezvous port on node 0, used when ``nnodes > 1``.
    master_port: int = 29500


class LocalInfra(InfraPlugin):
    """Runs torchrun on this machine and follows the run from the terminal."""

    name = "local"
    description = __doc__.splitlines()[0]
    api = ">=2.0,<3"
    Config = LocalConfig

    def world(self, cfg: LocalConfig) -> World:
        """Processes from the settings and the GPUs ``nvidia-smi`` sees."""
        from olmx.launch.devices import local_devices

        cfg.check()
        dev = local_devices()
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (dev.count or 2)
        if nproc < 1:
            raise ConfigError("infra.nproc_per_node", f"must be at least 1, got {nproc}")
        if dev.kind == "cuda" and nproc > dev.count:
            raise ConfigError("infra.nproc_per_node", f"{nproc} processes but this machine has {dev.count} GPU(s)")
        if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
            raise ConfigError("infra.node_rank", f"{cfg.node_rank} must be in [0, infra.nnodes={cfg.nnodes})")
        return World(
            nnodes=cfg.nnodes,
            nproc_per_node=nproc,
            device=dev.kind,
            device_name=dev.name,
            compute_capability=dev.compute_capability,
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

    def launch(self, cfg: LocalConfig, plan: Any) -> int:
        """Start torchrun with its output in ``RUN_DIR/logs/``, follow it, and end as the run
        did: 0 when it finished; otherwise :class:`RunFailed` with the exit code of
        :mod:`olmx.events` (75: stopped by a signal with a checkpoint, 76: stopped on a
        non-finite loss) or, when processes died, the rank that died first and its log tail.

        SIGTERM to this process (a scheduler taking the machine) is passed on to torchrun and
        its processes, which finish their step and save a checkpoint; Ctrl-C does the same."""
        import time
        import uuid

        from rich.console import Console

        from olmx.events import LAUNCH_ENV
        from olmx.launch.monitor import follow

        log_path = RunDir(plan.run_dir).node_log(cfg.node_rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        launch_id, started = uuid.uuid4().hex[:12], time.time()
        env = {**torchrun_env(cfg), **os.environ, LAUNCH_ENV: launch_id}
        console = Console(stderr=True)
        interrupted = False
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command(cfg, plan),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )

            def pass_on(signum: int, frame: Any) -> None:
                console.print(
                    f"{signal.Signals(signum).name}: stopping the run at the end of this step "
                    f"(a checkpoint is saved)..."
                )
                os.killpg(proc.pid, signum)

            previous = signal.signal(signal.SIGTERM, pass_on)
            try:
                try:
                    follow(plan, proc.poll, log_path=log_path, console=console)
                    rc = 0
                except RunFailed as exc:
                    rc = exc.exit_code
                except KeyboardInterrupt:
                    interrupted = True
                    pass_on(signal.SIGINT, None)
                    rc = proc.wait()
            finally:
                signal.signal(signal.SIGTERM, previous)
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
    ) -> int:
        """Record the rank failures of this launch in ``events.jsonl`` and turn its outcome
        into the return value or a :class:`RunFailed`."""
        from olmx.events import append_event, outcome, read_events
        from olmx.launch.failures import attempt_failures, latest_torchrun_dir

        with open(log_path, "rb") as f:
            f.seek(offset)
            console_text = f.read().decode(errors="replace")
        failures = attempt_failures(
            console_text,
            latest_torchrun_dir(RunDir(plan.run_dir).torchrun_logs, since=started),
            node_rank=cfg.node_rank,
        )
        for failure in failures:
            append_event(plan.run_dir, "rank_failed", launch=launch_id, **failure.as_event())
        # On several nodes global rank 0 (which writes the run's records) may be on any node, its
        # launcher's id unknown here: this launch's records are those written since it started.
        mine = launch_id if cfg.nnodes == 1 else None
        for e in read_events(plan.run_dir, launch=mine, since=started):
            if e["event"] == "checkpoint_corrupt":
                console.print(
                    f"[yellow]checkpoint step {e['step']} was corrupt[/] ({e['problem']}); "
                    f"moved to {e['moved_to']}, an older one was used",
                    highlight=False,
                )
        result = outcome(plan.run_dir, launch=mine, since=started, returncode=rc)
        restarts = failures if result.state != "failed" else failures[:-1]
        for failure in restarts:
            console.print(f"[yellow]restarted[/] after {failure.describe()}")
        if result.state == "complete":
            return 0
        resume = f"run the same olmx train again (trainer.run_dir={plan.run_dir}) to resume"
        if result.state == "stopped":
            raise RunFailed(
                f"{'interrupted, ' if interrupted else ''}{result.message}: {resume}",
                130 if interrupted else result.exit_code,
            )
        if result.state == "nonfinite":
            raise RunFailed(
                f"{result.message}; lower the learning rate (or set trainer.on_nonfinite=skip) and {resume}",
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
        from olmx.rundir import tail

        raise RunFailed(f"training failed with exit code {rc}; last lines of {log_path}:\n{tail(log_path)}", rc or 1)


LOCAL = LocalInfra()
