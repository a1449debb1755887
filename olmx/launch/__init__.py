"""Helpers shared by the infra plugins: torchrun settings and command, the worker command,
templates."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from olmx.plan import Plan
from olmx.rules import setting
from olmx.rundir import RunDir

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "TorchrunConfig",
    "torchrun_env",
    "threads_env",
    "SHARE_CORES_ENV",
    "torchrun_flags",
    "parent_death_preexec",
    "worker_command",
    "torchrun_command",
    "shell_join",
    "render_template",
]


@dataclass(frozen=True)
class TorchrunConfig:
    """How torchrun restarts and stops the workers; part of every infra target's settings."""

    #: torchrun elastic restarts of the whole group after a process fails; each restart
    #: resumes from the newest checkpoint that verifies.
    max_restarts: int = setting(0, ge=0)
    #: Seconds torchrun waits, after passing on a stop signal (SIGTERM/SIGINT), for the
    #: processes to finish their step and save a checkpoint before it kills them. Given to
    #: torchrun as ``PET_SHUTDOWN_TIMEOUT`` (its ``--shutdown-timeout``, torch 2.13+); torchrun
    #: of torch 2.11 and 2.12 has no such setting and waits its fixed 30 s.
    stop_timeout: int = setting(300, ge=1)


def torchrun_env(cfg: TorchrunConfig) -> dict[str, str]:
    """Environment of a torchrun olmx starts (on every infra target).

    ``PYTHONSAFEPATH=1``: torchrun and its workers (``python -m olmx run``) do not put the
    working directory first on the import path, so they import the installed olmx even when
    started from a folder that holds a directory named ``olmx/`` (Python 3.11+).

    With restarts, a fresh rendezvous store for every attempt: torchrun's shared agent store
    keeps the previous attempt's process-group addresses, and a restarted gloo group that reads
    one before its peer overwrote it fails with "connectFullMesh ... Connection refused".
    (Without restarts the shared store stays: it keeps the workers' store on the rendezvous
    port, which multi-node clusters open.)

    ``PET_SHUTDOWN_TIMEOUT``: the stop grace period, as an environment variable rather than
    ``--shutdown-timeout``, which torchrun of torch 2.11/2.12 refuses as an unknown option
    (torchrun reads every option from ``PET_<NAME>``; older releases ignore the variable)."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", "PET_SHUTDOWN_TIMEOUT": str(cfg.stop_timeout)}
    if cfg.max_restarts > 0:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


#: Set by a launcher when the user left ``OMP_NUM_THREADS`` unset: each worker then gives
#: itself ``cores / local processes`` threads (:func:`olmx.worker.run.share_cores`).
SHARE_CORES_ENV = "OLMX_SHARE_CORES"


def threads_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a launcher adds to torchrun's environment ``environ`` for the workers' threads:
    nothing when the user set ``OMP_NUM_THREADS`` (every worker keeps it); otherwise
    :data:`SHARE_CORES_ENV`, so each worker takes ``cores / local processes``, and
    ``OMP_NUM_THREADS=1`` for torchrun itself (which would otherwise set that for the workers,
    with a warning, and hide that the user had not)."""
    if "OMP_NUM_THREADS" in environ:
        return {}
    return {"OMP_NUM_THREADS": "1", SHARE_CORES_ENV: "1"}


def torchrun_flags(cfg: TorchrunConfig, run_dir: str | Path) -> list[str]:
    """torchrun options every infra target passes: restarts, and per-rank logs and error files
    of every attempt under ``RUN_DIR/logs/torchrun`` (which :mod:`olmx.launch.failures` reads)
    while the ranks' output still reaches the node log. (The stop grace period travels in
    :func:`torchrun_env`.)"""
    return [
        f"--max-restarts={cfg.max_restarts}",
        f"--log-dir={RunDir(run_dir).torchrun_logs}",
        "--tee=3",
    ]


def parent_death_preexec(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` (call it in the main thread): the child
    gets ``signum`` when this process dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``); if
    this process is already gone when the child starts, at once. For torchrun that means: it
    passes the stop to its workers, which finish their step, save a checkpoint and exit.
    None where the platform has no such call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    from olmx.stop import PR_SET_PDEATHSIG

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)

    return preexec


def worker_command(plan_path: str | Path, *, python: str | None = None) -> list[str]:
    """``python -m olmx run PLAN``: the command every process runs (under torchrun)."""
    return [python or sys.executable, "-m", "olmx", "run", str(plan_path)]


def torchrun_command(
    plan: Plan,
    cfg: TorchrunConfig,
    *,
    nnodes: int,
    nproc_per_node: int,
    node_rank: int | None = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "olmx",
    python: str | None = None,
) -> list[str]:
    """The torchrun command that starts one node's processes of ``plan``, each running
    ``python -m olmx run RUN_DIR/plan.yaml``; run it with :func:`torchrun_env` ``(cfg)`` in its
    environment.

    Arguments:

    * ``plan``: the finished plan (its ``run_dir`` holds torchrun's per-rank logs, its
      ``plan_path`` is what every process reads).
    * ``cfg``: the target's :class:`TorchrunConfig` (restarts; the stop grace period is in
      :func:`torchrun_env`), usually the infra plugin's own config, which extends it.
    * ``nnodes``: machines in the run (``plan.world.nnodes``); ``nproc_per_node``: processes on
      each (``plan.world.nproc_per_node``, one per GPU).
    * ``node_rank``: this machine's rank, 0 to ``nnodes - 1``; None lets the c10d rendezvous
      assign ranks (every node then runs the same command). Ignored without ``rdzv_endpoint``.
    * ``rdzv_endpoint``: ``host:port`` of the c10d rendezvous, on the first node, that every node
      reaches; None (one node only) means torchrun's ``--standalone`` rendezvous on a free local
      port.
    * ``rdzv_id``: the rendezvous id, the same on every node of one run and different between
      runs that share an endpoint.
    * ``python``: the interpreter on the target (default: this one, ``sys.executable``); give
      the path where olmx is installed on the remote machines.

    The ``local`` target runs it on this machine, with ``node_rank`` and ``rdzv_endpoint`` for a
    run started by hand on several machines."""
    py = python or sys.executable
    cmd = [
        py,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        *torchrun_flags(cfg, plan.run_dir),
    ]
    if rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
        if node_rank is not None:
            cmd.append(f"--node-rank={node_rank}")
    return cmd + ["-m", "olmx", "run", str(plan.plan_path)]


def shell_join(cmd: list[str]) -> str:
    """A command as one copy-pasteable shell line."""
    return shlex.join(cmd)


def render_template(name: str, **values: object) -> str:
    """Render ``templates/<name>`` (Jinja2, strict: an undefined name is an error) with the
    ``shquote`` filter (:func:`shlex.quote`). The templates folder is the checkout's
    ``templates/`` in a checkout or editable install, else the ``olmx.templates`` package data."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    environment.filters["shquote"] = lambda value: shlex.quote(str(value))
    return environment.get_template(name).render(**values)


def _templates_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if checkout.is_dir() and (checkout / "__init__.py").is_file():
        return checkout
    from importlib.resources import files

    return Path(str(files("olmx.templates")))
