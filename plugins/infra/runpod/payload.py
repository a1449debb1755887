"""What olmx ships to every RunPod pod: the pod's plan, the bootstrap script, the pins, the source, the data.

* :func:`render_bootstrap`: the script every node runs (``templates/runpod/bootstrap.sh.j2``):
  it installs olmx with pinned dependencies and runs torchrun.
* :func:`pinned_requirements`: the dependency pins of this olmx (``constraints.txt``).
* :func:`shipped_data`: the local data files copied to the pods (``infra.ship_data``).
* :func:`build_bundle`: all of it as one gzipped tar (:func:`.remote.bundle`), with the
  checkpoint a resumed run starts from.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError, LaunchError
from olmx.rundir import RunDir

from .config import RunPodConfig

#: Template of the bootstrap script inside the templates folder.
TEMPLATE = "runpod/bootstrap.sh.j2"


def render_bootstrap(cfg: RunPodConfig, plan: Any, launch_id: str = "runpod-LAUNCH") -> str:
    """The bootstrap script every node of one launch runs (``templates/runpod/bootstrap.sh.j2``);
    ``launch_id`` names the launch in ``events.jsonl`` (each launch gets a fresh one)."""
    from olmx.launch import render_template, torchrun_env, torchrun_flags

    return render_template(
        TEMPLATE,
        workdir=cfg.workdir,
        python=cfg.python,
        nproc_per_node=plan.world.nproc_per_node,
        env=sorted(cfg.env.items()),
        torch_range=torch_range(),
        install=cfg.install,
        flash_attn_wheel=cfg.flash_attn_wheel if plan.world.device == "cuda" else None,
        rdzv_id=f"olmx-{Path(plan.run_dir).name}",
        torchrun_env=sorted(torchrun_env(cfg).items()),
        torchrun_flags=torchrun_flags(cfg, f"{cfg.workdir}/run"),
        launch_id=launch_id,
    )


def build_bundle(plan: Any, cfg: RunPodConfig, launch_id: str = "runpod-LAUNCH") -> bytes:
    """What goes to every node: the pod's plan, the bootstrap, the pins, the source, and
    the checkpoint a resumed run starts from (with its metrics)."""
    import yaml

    from olmx_plugins.infra.runpod import remote as rm

    run_dir = f"{cfg.workdir}/run"
    data_files = shipped_data(plan, cfg)
    data = plan.run.data
    if data_files:
        data = replace(data, paths=[f"{cfg.workdir}/{name}" for name in data_files])
    run = replace(plan.run, trainer=replace(plan.run.trainer, run_dir=run_dir), data=data)
    pod_plan = replace(plan, run_dir=run_dir, run=run)
    files = {
        "run/plan.yaml": yaml.safe_dump(pod_plan.to_dict(), sort_keys=False).encode(),
        "bootstrap.sh": render_bootstrap(cfg, plan, launch_id).encode(),
        "constraints.txt": "".join(f"{r}\n" for r in pinned_requirements()).encode(),
    }
    trees: list[tuple[str, Path]] = list(data_files.items())
    if cfg.install:
        root = rm.source_root()
        trees += [(f"olmx-src/{part}", root / part) for part in rm.SOURCE_PARTS]
    if plan.resume_step is not None:
        local = RunDir(plan.run_dir)
        trees.append((f"run/checkpoints/step{plan.resume_step}", local.checkpoints / f"step{plan.resume_step}"))
        if local.metrics.exists():
            files["run/metrics.jsonl"] = local.metrics.read_bytes()
    return rm.bundle(files, trees)


def torch_range() -> tuple[str, str]:
    """``(lowest, below)``: the torch releases olmx supports, ``lowest <= version < below``,
    from the installed olmx's ``torch>=A,<B`` requirement."""
    from importlib import metadata

    from packaging.requirements import Requirement

    for text in metadata.requires("olmx") or []:
        req = Requirement(text)
        if req.name == "torch" and not req.marker:
            bounds = {s.operator: s.version for s in req.specifier}
            if ">=" in bounds and "<" in bounds:
                return bounds[">="], bounds["<"]
    raise LaunchError("the installed olmx declares no torch range (torch>=A,<B in its requirements)")


def pinned_requirements() -> list[str]:
    """``name==version`` of every installed distribution olmx needs (its dependency closure
    in this environment), except torch and its CUDA/triton companions, which the image brings."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, str] = {}
    todo = ["olmx"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    skip = re.compile(r"^(olmx|torch|triton|nvidia-.*|pytorch-triton.*)$")
    return sorted(f"{n}=={v}" for n, v in seen.items() if not skip.match(n) and "+" not in v)


def shipped_data(plan: Any, cfg: RunPodConfig) -> dict[str, Path]:
    """The local data files shipped to the pods, by their name under the pod's ``infra.workdir``
    (``data/000-name``, in ``data.paths`` order); ConfigError above ``infra.ship_data_max_gb``."""
    data = plan.run.data
    if not cfg.ship_data or data.name == "stdlib":
        return {}
    files = plan.data_files()
    total = sum(f.stat().st_size for f in files)
    if total > cfg.ship_data_max_gb * 1e9:
        raise ConfigError(
            "infra.ship_data_max_gb",
            f"data.paths hold {total / 1e9:.1f} GB, more than the "
            f"{cfg.ship_data_max_gb:g} GB olmx copies to pods over SSH; put the data on a network "
            "volume (infra.network_volume_id) or in the image and set infra.ship_data=false",
        )
    return {f"data/{i:03d}-{f.name}": f for i, f in enumerate(files)}


def shipped_data_note(plan: Any, cfg: RunPodConfig) -> str:
    """What the dry run says about shipped data files ('' when none are shipped)."""
    files = shipped_data(plan, cfg)
    if not files:
        return ""
    return f", data/ ({len(files)} data file(s), {sum(f.stat().st_size for f in files.values()) / 1e6:.1f} MB)"
