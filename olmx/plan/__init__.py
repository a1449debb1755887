"""The Plan: a resolved, checked, frozen, typed description of a run, saved as ``plan.yaml``
in the run directory (one codec, :mod:`olmx.plan.codec`). Launchers and workers read it;
nobody composes config or recomputes a decision after it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmx.api import Dtypes, Mesh, World
from olmx.config.schema import RunConfig
from olmx.rundir import PLAN_FILE

#: ``Plan.clip``: who clips gradients. ``olmo_core``: OLMo-core's train module; ``olmx``: the
#: core's clipping across device meshes (a plugin put parameters on a mesh of their own);
#: ``off``: ``trainer.max_grad_norm`` is null.
CLIP_MODES = ("olmo_core", "olmx", "off")


@dataclass(frozen=True)
class BatchPlan:
    """Batch geometry; sequences and tokens."""

    seq_len: int
    global_seqs: int
    micro_seqs: int
    dp_ranks: int
    grad_accum: int

    @property
    def global_tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.global_seqs * self.seq_len

    @property
    def micro_tokens(self) -> int:
        """Tokens per forward/backward on one process."""
        return self.micro_seqs * self.seq_len


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts computed from the config (no model is built)."""

    total: int
    embedding: int
    active: int

    @property
    def non_embedding(self) -> int:
        """Everything but the input embedding."""
        return self.total - self.embedding


@dataclass(frozen=True)
class Plan:
    """Everything a launcher and a worker need, typed."""

    #: The resolved configuration (plugin sections typed by the plugins' ``Config``).
    run: RunConfig
    world: World
    mesh: Mesh
    dtypes: Dtypes
    batch: BatchPlan
    params: ParamCounts
    #: Model vocabulary (tokenizer vocabulary padded to a multiple of 128).
    vocab_size: int
    run_dir: str
    #: Step of the checkpoint the run resumes from (None: starts fresh).
    resume_step: int | None
    #: Who clips gradients (:data:`CLIP_MODES`).
    clip: str = "olmo_core"
    #: Plugin section (``layers.moe``) -> the decisions its ``resolve`` made.
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Plugin section -> rows for the printed plan.
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    olmx_version: str = ""

    @property
    def infra(self) -> Any:
        """The infra plugin's typed settings."""
        return self.run.infra[self.run.infra_name]

    @property
    def plan_path(self) -> Path:
        """Where the plan is saved."""
        return Path(self.run_dir) / PLAN_FILE

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML (the run config under ``config``, infra flat)."""
        from olmx.plan.codec import run_to_data, to_data

        data = {k: to_data(getattr(self, k)) for k in self.__dataclass_fields__ if k != "run"}
        return {"config": run_to_data(self.run), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], reg: Any = None) -> Plan:
        """Inverse of :meth:`to_dict`; plugin sections typed by the plugins ``reg`` loads
        (default: the process's registry)."""
        from olmx.plan.codec import from_data, run_from_data

        if reg is None:
            from olmx.registry import registry

            reg = registry()
        data = dict(data)
        run = run_from_data(data.pop("config"), reg)
        return from_data(cls, {**data, "run": run})

    def save(self) -> Path:
        """Write ``plan.yaml`` atomically into the run directory."""
        import yaml

        path = self.plan_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".yaml.tmp{os.getpid()}")  # several launchers may share a run dir
        tmp.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, reg: Any = None) -> Plan:
        """Read a saved plan."""
        import yaml

        return cls.from_dict(yaml.safe_load(Path(path).read_text()), reg)
