"""This machine (or several, by hand): torchrun starts the processes; progress in the terminal."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from olmx.errors import ConfigError, RunFailed
from olmx.protocols import World


@dataclass
class LocalConfig:
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
    #: torchrun elastic restarts of the whole group after a process fails.
    max_restarts: int = 0


class LocalInfra:
    """Runs torchrun on this machine and follows the run from the terminal."""

    name = "local"
    description = __doc__.splitlines()[0]
    api = ">=1.0,<2"
    Config = LocalConfig

    def world(self, cfg: LocalConfig) -> World:
        """Processes from the settings and the GPUs ``nvidia-smi`` sees."""
        from olmx.launch.devices import local_devices

        dev = local_devices()
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (dev.count or 2)
        if nproc < 1:
            raise ConfigError("infra.nproc_per_node", f"must be at least 1, got {nproc}")
        if dev.kind == "cuda" and nproc > dev.count:
            raise ConfigError("infra.nproc_per_node", f"{nproc} processes but this machine has {dev.count} GPU(s)")
        if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
            raise ConfigError("infra.node_rank", f"{cfg.node_rank} must be in [0, infra.nnodes={cfg.nnodes})")
        return World(nnodes=cfg.nnodes, nproc_per_node=nproc, device=dev.kind, device_name=dev.name,
                     compute_capability=dev.compute_capability)

    def command(self, plan: Any) -> list[str]:
        """The torchrun command line for this node."""
        from olmx.launch import torchrun_command

        cfg = self._cfg(plan)
        endpoint = None if cfg.nnodes == 1 else f"{cfg.master_addr}:{cfg.master_port}"
        return torchrun_command(plan, nnodes=cfg.nnodes, nproc_per_node=plan.world.nproc_per_node,
                                node_rank=cfg.node_rank, rdzv_endpoint=endpoint, max_restarts=cfg.max_restarts)

    def dry_run(self, plan: Any) -> str:
        """The exact command that would run."""
        from olmx.launch import shell_join

        return shell_join(self.command(plan))

    def launch(self, plan: Any) -> int:
        """Start torchrun with its output in ``RUN_DIR/logs/``, follow it, return its exit code."""
        from rich.console import Console

        from olmx.launch.monitor import follow

        log_dir = Path(plan.run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"node{self._cfg(plan).node_rank}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(self.command(plan), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                return follow(plan, proc.poll, log_path=log_path, console=Console(stderr=True))
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait()
                raise RunFailed(f"interrupted; the run can resume from its last checkpoint in {plan.run_dir}", 130)

    @staticmethod
    def _cfg(plan: Any) -> LocalConfig:
        raw = dict(plan.config["infra"])
        raw.pop("name", None)
        return LocalConfig(**raw)


LOCAL = LocalInfra()
