"""Helpers shared by the infra plugins: the worker command and following a run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from olmx.plan import Plan


def worker_command(plan_path: str | Path, *, python: str | None = None) -> list[str]:
    """``python -m olmx run PLAN``: the command every process runs (under torchrun)."""
    return [python or sys.executable, "-m", "olmx", "run", str(plan_path)]


def torchrun_command(
    plan: Plan,
    *,
    nnodes: int,
    nproc_per_node: int,
    node_rank: int | None = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "olmx",
    max_restarts: int = 0,
    python: str | None = None,
) -> list[str]:
    """torchrun over :func:`worker_command`; ``rdzv_endpoint=None`` on one node means a
    standalone rendezvous on a free local port."""
    py = python or sys.executable
    cmd = [py, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
           f"--max-restarts={max_restarts}"]
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
        loader=jinja2.FileSystemLoader(_templates_dir()), undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
    )
    environment.filters["shquote"] = lambda value: shlex.quote(str(value))
    return environment.get_template(name).render(**values)


def _templates_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if checkout.is_dir() and (checkout / "__init__.py").is_file():
        return checkout
    from importlib.resources import files

    return Path(str(files("olmx.templates")))
