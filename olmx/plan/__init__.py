"""The Plan: a resolved, checked, frozen, typed description of a run, saved as ``plan.yaml``
in the run directory (one codec, :mod:`olmx.plan.codec`). Launchers and workers read it;
nobody composes config or recomputes a decision after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmx.config.schema import RunConfig
from olmx.plan.execution import Execution
from olmx.rundir import PLAN_FILE
from olmx.types import Dtypes, Mesh, World


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
    #: The attention rule, ``torch.compile`` and the metrics cadence for the target's device.
    execution: Execution = field(default_factory=Execution)
    #: Plugin section (``layers.moe``) -> the decisions its ``resolve`` made (an instance of
    #: the plugin's ``Decisions``, or a plain dict).
    decisions: dict[str, Any] = field(default_factory=dict)
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

    def summary_rows(self) -> list[tuple[str, str]]:
        """The core rows of the printed plan (plugins add their own :attr:`sections`)."""
        b, p, w = self.batch, self.params, self.world
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.dims().items())
        rows = [
            ("world", f"{w.size} processes = {w.nnodes} node(s) x {w.nproc_per_node} ({w.device_name})"),
            ("mesh", mesh),
            ("global batch", f"{b.global_seqs} sequences = {b.global_tokens:,} tokens"),
            (
                "micro batch / process",
                f"{b.micro_seqs} sequences = {b.micro_tokens:,} tokens"
                f"{f', {b.grad_accum} accumulation steps' if b.grad_accum > 1 else ''}",
            ),
            ("parameters", f"{p.total:,} total, {p.non_embedding:,} non-embedding, {p.active:,} active"),
            ("vocabulary", f"{self.vocab_size} (padded)"),
            ("dtypes", f"compute {self.dtypes.param}, gradient reduction {self.dtypes.reduce}, master weights float32"),
            (
                "optimizer",
                {"skip_step_adamw": "OLMo-core SkipStepAdamW", "adamw": "torch AdamW"}[self.run.trainer.optimizer]
                + f", lr {self.run.trainer.lr:g}, weight decay {self.run.trainer.weight_decay:g}"
                + ("" if self.run.trainer.decay_embeddings else " (not on the embeddings)"),
            ),
            (
                "gradient clipping",
                "off"
                if self.run.trainer.max_grad_norm is None
                else f"global norm {self.run.trainer.max_grad_norm}, across device meshes",
            ),
            *(("execution", note) for note in self.execution.notes),
            ("run dir", self.run_dir),
            ("resume", f"from step {self.resume_step}" if self.resume_step is not None else "no (fresh start)"),
        ]
        return rows

    def data_files(self) -> list[Path]:
        """The local files ``data.paths`` names (globs expanded, in order)."""
        from olmx.data.files import text_files

        return text_files(list(self.run.data.paths))

    def config_yaml(self) -> str:
        """The resolved run config as YAML (what ``--dry-run`` prints; ``plan.yaml`` holds the
        same data under ``config``)."""
        from omegaconf import OmegaConf

        from olmx.plan.codec import run_to_data

        return OmegaConf.to_yaml(OmegaConf.create(run_to_data(self.run)))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML (the run config under ``config``, infra flat)."""
        from olmx.plan.codec import run_to_data, to_data

        data = {k: to_data(getattr(self, k)) for k in self.__dataclass_fields__ if k != "run"}
        return {"config": run_to_data(self.run), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], reg: Any = None) -> Plan:
        """Inverse of :meth:`to_dict`; plugin sections typed by the plugins ``reg`` loads
        (default: the process's registry). Raises :class:`olmx.plan.codec.PlanDataError` (a
        ``ValueError`` saying where) for data that does not fit the plan's types."""
        from olmx.plan.codec import PlanDataError, decisions_from_data, from_data, run_from_data

        if not isinstance(data, dict):
            raise PlanDataError(f"expected a mapping of the plan's keys, got {type(data).__name__}")
        if reg is None:
            from olmx.registry import registry

            reg = registry()
        data = dict(data)
        if "config" not in data:
            raise PlanDataError("missing key config")
        if "run" in data:
            raise PlanDataError("Plan has no field(s) run (the run config is under config)")
        run = run_from_data(data.pop("config"), reg)
        decisions = decisions_from_data(data.pop("decisions", {}), run, reg)
        return from_data(cls, {**data, "run": run, "decisions": decisions})

    def save(self) -> Path:
        """Write ``plan.yaml`` atomically into the run directory (:func:`olmx.plan.codec.write_plan_file`)."""
        from olmx.plan.codec import write_plan_file

        path = self.plan_path
        path.parent.mkdir(parents=True, exist_ok=True)
        write_plan_file(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | Path, reg: Any = None) -> Plan:
        """Read a saved plan. A missing, unreadable, empty, binary, truncated or otherwise
        invalid file raises ``ConfigError("PLAN", ...)`` saying which (the CLI prints one
        line and exits 2)."""
        from olmx import __version__
        from olmx.errors import ConfigError
        from olmx.plan.codec import PlanDataError, read_plan_file

        p = Path(path)
        data = read_plan_file(p)
        try:
            return cls.from_dict(data, reg)
        except PlanDataError as exc:
            raise ConfigError("PLAN", f"'{p}' is not a plan olmx {__version__} can read: {exc}") from None
