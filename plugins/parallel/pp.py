"""Pipeline parallelism: the blocks split into consecutive stages, one group of ranks each (OLMo-core's PP).

``parallel=[ddp,pp] parallel.pp.degree=2``: the ranks form ``degree`` pipeline groups; each
holds a consecutive slice of the blocks (the first stage the embedding, the last the output
head) and every micro-batch's activations travel forward through the stages and its gradients
back, under one of torch's pipeline schedules. The world divided by the degree does data
parallelism with the other strategy (``ddp``, ``fsdp``, ``hsdp``, ``ddp_ep``), each stage's
parameters replicated or sharded over its data-parallel ranks (and its experts, under expert
parallelism, over the expert-parallel ranks among them), and tensor (``tp``) or sequence
(``ulysses``) parallelism within each stage.

What comes from OLMo-core 3.0.0: ``TransformerPipelineParallelConfig`` (the train module's
``pp_config``, which makes it build ``TransformerPipelineTrainModule``), the model split
(``split_points``: by default one stage per rank for single-stage schedules, two for the
multi-stage ones) and the schedules of ``torch.distributed.pipelining``. What olmx adds: the
mesh dimension (``pp``, claimed here, validated with the others by the plan), the schedule
chosen for the model, and the checks before anything starts: enough blocks for the stages and
enough micro-batches per step for every stage to work (a schedule runs the micro-batches of
one optimizer step through the pipeline; fewer than the stages leave stages idle the whole step),
and no downstream tasks (they score the output head's logits; the worker's forward-only pass
through the stages returns the held-out loss, :mod:`olmx.worker.pipeline`).

Each stage starts from its part of the model a run without a pipeline starts from at the same
``trainer.seed`` (the worker draws the stage's weights as the whole model draws them,
:class:`olmx.worker.pipeline.OneModelInit`), so a fresh pipelined run has that run's losses;
not yet the weights a layer's module draws from torch's global generator in its own
``reset_parameters`` (Engram's projections) on a stage after the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Optional

from olmx.api import Context, Contribution, ParallelPlugin, World, setting
from olmx.errors import ConfigError

#: OLMo-core's schedules (``PipelineScheduleType``) -> stages per rank (1: single-stage).
SCHEDULES = {"1F1B": 1, "GPipe": 1, "Interleaved1F1B": 2, "LoopedBFS": 2, "InterleavedZeroBubble": 2}
#: ``schedule``'s closed choice (the names are OLMo-core's ``PipelineScheduleType`` values).
Schedule = StrEnum(
    "Schedule",
    [
        ("1F1B", "1F1B"),
        ("GPipe", "GPipe"),
        ("Interleaved1F1B", "Interleaved1F1B"),
        ("LoopedBFS", "LoopedBFS"),
        ("InterleavedZeroBubble", "InterleavedZeroBubble"),
    ],
)


@dataclass(frozen=True)
class PipelineParallelConfig:
    """Settings of ``parallel.pp``."""

    #: Pipeline stages (groups of ranks): it must divide the world size; the blocks are split
    #: into ``degree`` (single-stage schedules) or ``2 x degree`` (interleaved) consecutive stages.
    degree: int = setting(2, ge=2)
    #: OLMo-core's schedule name. Single-stage: ``1F1B`` (one forward, one backward in turn:
    #: at most ``degree`` micro-batches' activations alive) or ``GPipe`` (all forwards, then all
    #: backwards). Two stages per rank: ``Interleaved1F1B`` (a smaller bubble), ``LoopedBFS``,
    #: ``InterleavedZeroBubble``. null: ``Interleaved1F1B`` where the blocks make ``2 x degree``
    #: stages, else ``1F1B``.
    schedule: Optional[Schedule] = setting(None, choices=Schedule)


def schedule_of(cfg: PipelineParallelConfig, n_layers: int) -> str:
    """The schedule the run uses: the one set, else the default for the model (see the field)."""
    if cfg.schedule is not None:
        return cfg.schedule
    return "Interleaved1F1B" if n_layers >= 2 * cfg.degree else "1F1B"


def in_flight(schedule: str, degree: int, microbatches: int) -> int:
    """Micro-batches whose activations the first rank keeps at once, in whole stages' worth of
    blocks: ``1F1B`` runs ``degree`` forwards before its first backward; ``GPipe`` and
    ``LoopedBFS`` all of them; the interleaved schedules ``2 (degree - 1) + (v - 1) degree + 1``
    forwards of a stage chunk (``1 / v`` of a rank's blocks) before theirs (torch's warm-up)."""
    v = SCHEDULES[schedule]
    if schedule in ("GPipe", "LoopedBFS"):
        return microbatches
    if v == 1:
        return min(microbatches, degree)
    chunks = min(microbatches * v, 2 * (degree - 1) + (v - 1) * degree + 1)
    return -(-chunks // v)


def bubble(schedule: str, degree: int, microbatches: int) -> float:
    """Idle fraction of one step of a pipeline: ``(p - 1) / (m + p - 1)`` for the single-stage
    schedules, the interleaved ones ``(p - 1) / (v m + p - 1)`` with ``v`` stages per rank
    (Narayanan et al., 2021)."""
    v = SCHEDULES[schedule]
    return (degree - 1) / (v * microbatches + degree - 1)


class PipelineParallel(ParallelPlugin):
    """OLMo-core pipeline parallelism over torch's schedules."""

    name = "pp"
    api = ">=3.0,<4"
    Config = PipelineParallelConfig
    provides = ("pipeline",)

    def options(self, cfg: PipelineParallelConfig | None, run: Any, world: World) -> list[tuple[str, Any]]:
        """Under ``parallel=auto``: each degree from 2 up that divides the world and has a block
        per stage, smallest first, with the default schedule (a pipeline's bubble and its
        micro-batches in flight cost more than sharding: ``auto`` tries it last)."""
        if cfg is not None:
            return [("", cfg)]
        degrees = [p for p in range(2, world.size + 1) if not world.size % p and p <= run.model.n_layers]
        return [(f"parallel.pp.degree={p}", PipelineParallelConfig(degree=p)) for p in degrees]

    def claim(self, cfg: PipelineParallelConfig, run: Any, world: World) -> dict[str, int]:
        """Check the stages against the blocks; claim ``pp``."""
        schedule = schedule_of(cfg, run.model.n_layers)
        stages = cfg.degree * SCHEDULES[schedule]
        if run.model.n_layers < stages:
            raise ConfigError(
                f"{self.section}.degree"
                if cfg.schedule is None or SCHEDULES[schedule] == 1
                else f"{self.section}.schedule",
                f"{schedule} splits the model into {stages} stages ({SCHEDULES[schedule]} per rank x degree "
                f"{cfg.degree}), more than its model.n_layers={run.model.n_layers} blocks",
            )
        return {"pp": cfg.degree}

    def resolve(self, cfg: PipelineParallelConfig, ctx: Context) -> Contribution:
        """The stages, the micro-batches per step and the bubble."""
        run, mesh = ctx.run, ctx.mesh
        if run.eval.interval and run.eval.downstream:
            raise ConfigError(
                "eval.downstream",
                "the downstream tasks score the output head's logits, which a pipeline's last stage does not "
                "return (its held-out loss is evaluated): set eval.downstream=[] or train without a pipeline",
            )
        schedule = schedule_of(cfg, run.model.n_layers)
        v = SCHEDULES[schedule]
        t = run.trainer
        microbatches = t.global_batch_size // (mesh.dp * t.micro_batch_size)
        if microbatches < cfg.degree:
            raise ConfigError(
                "trainer.global_batch_size",
                f"{t.global_batch_size} sequences give each pipeline {microbatches} micro-batch(es) of "
                f"trainer.micro_batch_size={t.micro_batch_size} per step, fewer than its {cfg.degree} stages "
                f"(some would idle the whole step): use at least {cfg.degree * mesh.dp * t.micro_batch_size} "
                "sequences or smaller micro-batches",
            )
        stages = cfg.degree * v
        per_stage = run.model.n_layers / stages
        idle = bubble(schedule, cfg.degree, microbatches)
        kept = in_flight(schedule, cfg.degree, microbatches)
        rows = [
            (
                "stages",
                f"{stages} ({v} per rank, {schedule}) of ~{per_stage:.3g} blocks; the first holds the embedding, "
                f"the last the output head",
            ),
            (
                "micro-batches",
                f"{microbatches} per pipeline per step (trainer.global_batch_size / (data-parallel ranks x "
                f"trainer.micro_batch_size)); bubble {idle:.0%} of the step; the first rank keeps the activations "
                f"of {kept} at once",
            ),
        ]
        return Contribution(rows=rows, microbatches_in_flight=kept, idle_fraction=idle)

    def apply_train_module(
        self, cfg: PipelineParallelConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]
    ) -> Any:
        """Set OLMo-core's ``pp_config``."""
        from olmo_core.distributed.parallel import PipelineScheduleType
        from olmo_core.train.train_module import TransformerPipelineParallelConfig

        schedule = PipelineScheduleType(schedule_of(cfg, plan.run.model.n_layers))
        train_module.pp_config = TransformerPipelineParallelConfig(degree=cfg.degree, schedule=schedule)
        return train_module


PP = PipelineParallel()
