"""The adapter over torch's pipeline schedules (``torch.distributed.pipelining``) that olmx's
pipeline train module (:mod:`olmx.worker.pipeline`) drives in place of OLMo-core's schedule
driver: :class:`TorchSchedule` (training and a forward-only pass for evaluation) and
:func:`find_meshes_in` (the meshes of the DTensor activations a stage receives). The private
parts of torch it touches are in :data:`olmx.worker.pipeline_seams.PRIVATE_SEAMS`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch


def _output_is_the_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage's output already is the micro-batch's share of the loss (OLMo-core's
    ``run_pipeline`` hook returns it); the schedule backpropagates it as it is."""
    del target
    return output.sum()


class TorchSchedule:
    """The interface OLMo-core's train module drives (``step``, ``has_first_stage``,
    ``has_last_stage``) over one of ``torch.distributed.pipelining``'s schedules. Gradients are
    not divided by the micro-batches (``scale_grads=False``): each micro-batch's loss is already
    its sum over the batch's tokens divided by all of them, so the sum over micro-batches is the
    batch's mean, as without a pipeline."""

    def __init__(self, stages: list[Any], schedule: str, microbatches: int, get_mesh: Callable[..., Any]) -> None:
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

        cls = get_schedule_class(schedule)
        single = issubclass(cls, PipelineScheduleSingle)
        self.stages = stages
        self.num_microbatches = microbatches
        #: The mesh of a DTensor activation's dimension names (the world mesh's slice).
        self.get_mesh = get_mesh
        self.impl = cls(
            stages[0] if single else stages,
            n_microbatches=microbatches,
            loss_fn=_output_is_the_loss,
            scale_grads=False,
        )

    @cached_property
    def has_first_stage(self) -> bool:
        """This rank holds the stage with the embedding."""
        return any(stage.is_first for stage in self.stages)

    @cached_property
    def has_last_stage(self) -> bool:
        """This rank holds the stage with the output head."""
        return any(stage.is_last for stage in self.stages)

    def step(self, input_ids: torch.Tensor, target: torch.Tensor | None = None, **kwargs: Any) -> None:
        """One optimizer step's forward and backward of every micro-batch through the stages;
        ``kwargs`` (the labels, the loss divisor) reach every stage, split like the batch."""
        args = (input_ids,) if self.has_first_stage else ()
        self.impl.step(*args, target=target if self.has_last_stage else None, **kwargs)

    def eval(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """``input_ids`` forward through the stages, as one micro-batch, under a forward-only
        schedule of its own (:attr:`forward_only`); the last stage's output on the rank that holds
        it, else None."""
        args = (input_ids,) if self.has_first_stage else ()
        return self.forward_only.step(*args, **kwargs)

    @cached_property
    def forward_only(self) -> Any:
        """A schedule without a loss (forward only) over stages of its own around the same
        model parts: torch's stages size their buffers for the first batch they see and for
        training or not, and switching the training schedule to ``eval`` and back makes its
        stages infer their shapes again with a forward of made-up inputs that the train module's
        hooks would count as a micro-batch's loss. One micro-batch: evaluation batches need not
        divide into the training micro-batches."""
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import ScheduleGPipe, ScheduleLoopedBFS

        stages = [
            PipelineStage(
                stage.submod,
                stage.stage_index,
                stage.num_stages,
                stage.device,
                group=stage.group,
                get_mesh=self.get_mesh,
            )
            for stage in self.stages
        ]
        if len(stages) == 1:
            return ScheduleGPipe(stages[0], n_microbatches=1)
        return ScheduleLoopedBFS(stages, n_microbatches=1)


def find_meshes_in(stage: Any, get_mesh: Callable[..., Any]) -> None:
    """Let ``stage`` rebuild the tensor-parallel activations it receives: torch's stages send a
    DTensor's metadata with its mesh's dimension names and look the mesh up on arrival, through
    the ``get_mesh`` callback of ``PipelineStage``'s constructor, which OLMo-core's split (before
    tensor parallelism is applied) does not pass. Every stage's meshes are slices of the world's."""
    stage._mesh_cache._get_mesh_cb = get_mesh
