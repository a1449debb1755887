"""The Plan: a resolved, checked, frozen description of a run, saved as ``plan.yaml`` in the
run directory. Launchers and workers read it; nobody composes config again after it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from olmx.api import World

PLAN_FILE = "plan.yaml"


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
    """Everything a launcher and a worker need."""

    #: The resolved configuration, as plain data (``olmx.config.compose.as_dict``).
    config: dict[str, Any]
    world: World
    #: Device-mesh dimensions, e.g. ``{"dp": 2}``.
    mesh: dict[str, int]
    batch: BatchPlan
    params: ParamCounts
    #: Model vocabulary (tokenizer vocabulary padded to a multiple of 128).
    vocab_size: int
    run_dir: str
    #: Step of the checkpoint the run resumes from (None: starts fresh).
    resume_step: int | None
    #: Plugin name -> rows for the printed plan.
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    olmx_version: str = ""

    @property
    def plan_path(self) -> Path:
        """Where the plan is saved."""
        return Path(self.run_dir) / PLAN_FILE

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML."""
        data = asdict(self)
        data["sections"] = {k: [list(r) for r in v] for k, v in self.sections.items()}
        if self.world.compute_capability is not None:
            data["world"]["compute_capability"] = list(self.world.compute_capability)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`."""
        world = dict(data["world"])
        if world.get("compute_capability") is not None:
            world["compute_capability"] = tuple(world["compute_capability"])
        return cls(
            config=data["config"], world=World(**world), mesh=dict(data["mesh"]),
            batch=BatchPlan(**data["batch"]), params=ParamCounts(**data["params"]),
            vocab_size=data["vocab_size"], run_dir=data["run_dir"], resume_step=data["resume_step"],
            sections={k: [tuple(r) for r in v] for k, v in data.get("sections", {}).items()},
            olmx_version=data.get("olmx_version", ""),
        )

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
    def load(cls, path: str | Path) -> Plan:
        """Read a saved plan."""
        import yaml

        return cls.from_dict(yaml.safe_load(Path(path).read_text()))
