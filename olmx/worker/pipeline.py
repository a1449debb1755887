"""Pipeline parallelism under torch's standard schedules (``parallel=[...,pp]``).

OLMo-core 3.0.0 splits the model into stages (``TransformerPipelineParallelConfig.split_model``,
torch's ``PipelineStage`` for the standard schedules) and trains them in
``TransformerPipelineTrainModule``, but its schedule driver (``PipelineSchedule``) runs only its
own CUDA schedules (``CustomInterleaved1F1B``, ``Custom1F1BV``: they place tensors with
``torch.cuda.current_device()``) and refuses torch's ``1F1B``, ``GPipe``, ``Interleaved1F1B``
and the rest. :class:`PipelineTrainModule` is OLMo-core's train module with its schedule
replaced by torch's (:class:`olmx.worker.pipeline_schedule.TorchSchedule`, the adapter), which
runs on any device and backend, gloo on CPUs included, a forward-only pass for evaluation
(:meth:`PipelineTrainModule.eval_batch`: the held-out loss), the micro-batch's token ids to every
stage (:data:`olmx.api.PIPELINE_TOKEN_IDS`), the batch sharded over the sequence-parallel ranks
before the schedule (:meth:`PipelineTrainModule._prepare_batch`), and four fixes that make it
equal a run without a pipeline:

* DDP's replicas (OLMo-core's composable ``replicate``, which torch's stages do not recognise)
  would all-reduce after every micro-batch's backward while other micro-batches' forwards are
  pending, which DDP's reducer does not follow: their gradient sync is off during the schedule
  and the gradients are averaged over the data-parallel ranks once, after it (FSDP's modules
  torch's stages handle themselves);
* torch's ``replicate`` over a slice of the mesh hooks every forward to rewrite DTensor
  parameters, FSDP's experts included: the hooks are removed (:func:`_drop_dtensor_localizing_hooks`);
* the step's loss reaches the ranks without the final stage by a broadcast over the pipeline
  group (OLMo-core sends it on with an ``isend`` it never waits for, which gloo leaves pending
  while the sender moves on to the next collective), averaged first over the data-parallel and
  the tensor- and sequence-parallel ranks (OLMo-core averages it over the former only, so each
  tensor-parallel rank reported the loss of its slice of the sequence);
* under tensor parallelism the stages send and receive DTensor activations, whose meshes they
  look up in the world's (:func:`olmx.worker.pipeline_schedule.find_meshes_in`).

The plugins' model edits run on each stage after the split (:func:`edit_stages_after_split`).
The private parts of OLMo-core and torch this module and the adapter touch are listed, and
checked when the train module is built, in :data:`olmx.worker.pipeline_seams.PRIVATE_SEAMS`.
Everything else (the split, the losses each last stage captures, the data-parallel wrapping of
each stage, checkpoints of the model parts, an optimizer per part) is OLMo-core's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist
from olmo_core.distributed.utils import get_world_size
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.train.train_module.transformer.pipeline_train_module import TransformerPipelineTrainModule

from olmx.types import PIPELINE_TOKEN_IDS
from olmx.worker.pipeline_schedule import TorchSchedule, find_meshes_in
from olmx.worker.pipeline_seams import check_seams


class PipelineTrainModule(TransformerPipelineTrainModule):
    """OLMo-core's pipeline train module driving :class:`TorchSchedule`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for part in self.model_parts:
            _drop_dtensor_localizing_hooks(part)
            if isinstance(part.init_method, OneModelInit):  # initialised: back to the stage's own
                part.init_method = part.init_method.base
        if self.tp_enabled:
            for stage in self._pp_stages or []:
                find_meshes_in(stage, self._get_mesh)

    def run_pipeline(self, *args: Any, **kwargs: Any) -> Any:
        """OLMo-core's, with the replicas' gradients averaged once after the schedule, and the
        losses on every rank where OLMo-core records them with a reduction (the CE loss under an
        optimizer other than ``SkipStepAdamW``, the Z loss): recorded on the final stage's ranks
        only, they make the trainer's metrics differ between ranks, and OLMo-core's reduction of
        such metrics fills in every name ever recorded with zeros, so a step whose metrics arrive
        in two flushes (a checkpoint step's) logged a second CE loss of 0.0."""
        from olmo_core.optim import SkipStepOptimizer
        from torch.distributed.fsdp import FSDPModule

        replicas = [
            m for m in self.model_parts if hasattr(m, "set_requires_gradient_sync") and not isinstance(m, FSDPModule)
        ]
        for part in replicas:
            part.set_requires_gradient_sync(False)
        ce, z = super().run_pipeline(*args, **kwargs)
        if replicas and (self.dp_world_size > 1 or self.cp_enabled):
            self._average_grads(replicas)
        if not isinstance(self.optimizers[0], SkipStepOptimizer):  # else train_batch sends it on itself
            ce = self.reduce_send_recv(ce)
        if self.z_loss_multiplier is not None:
            z = self.reduce_send_recv(z)
        return ce, z

    def eval_batch(self, batch: dict[str, Any], labels: torch.Tensor | None = None) -> Any:
        """The per-token CE loss of ``batch``, which OLMo-core's pipeline module does not compute
        (it has no forward-only pass): the batch goes forward through the stages as one
        micro-batch (:attr:`olmx.worker.pipeline_schedule.TorchSchedule.forward_only`), the last
        stage returns its unreduced loss (whole, under tensor parallelism), broadcast over the
        pipeline group so that every rank's evaluator counts the same losses. No logits: the
        held-out loss needs none."""
        from olmo_core.nn.lm_head import LMOutputWithLoss
        from torch.distributed.tensor import DTensor

        input_ids, labels, kwargs = self._prepare_batch(batch, labels)
        assert labels is not None

        def per_token_loss(model: Any, args: Any, output: Any) -> Any:
            del args
            if model.lm_head is None:
                return output
            ce = output.ce_loss
            return ce.full_tensor() if isinstance(ce, DTensor) else ce

        for part in self.model_parts:
            part.eval()
        handles = [part.register_forward_hook(per_token_loss) for part in self.model_parts]
        try:
            with self._model_forward_context():
                out = self._train_pp_schedule.eval(
                    input_ids,
                    labels=labels,
                    ignore_index=self.label_ignore_index,
                    loss_reduction="none",
                    return_logits=False,
                    **kwargs,
                )
        finally:
            for handle in handles:
                handle.remove()
        if self.pp_group_rank == self.pp_final_stage_rank:
            ce_loss = out.float().contiguous()
        else:
            ce_loss = torch.empty(labels.shape, device=self.device)
        dist.broadcast(ce_loss, group=self.pp_group, group_src=self.pp_final_stage_rank)
        for group in self._cp_groups:  # each rank of a sequence-parallel group has a contiguous slice
            slices = [torch.empty_like(ce_loss) for _ in range(get_world_size(group))]
            dist.all_gather(slices, ce_loss, group=group)
            ce_loss = torch.cat(slices, dim=1)
        return LMOutputWithLoss(logits=None, loss=ce_loss.sum(), ce_loss=ce_loss, z_loss=None)

    def _prepare_batch(self, batch: dict[str, Any], labels: torch.Tensor | None = None) -> Any:
        """OLMo-core's, plus the token ids for every stage (:data:`olmx.api.PIPELINE_TOKEN_IDS`)
        and, under sequence parallelism, the input ids and labels sharded here, before the
        schedule (a stage after the first could not shard the hidden states it receives): each
        stage's model is told so (``cp_already_sharded``) and shards only its RoPE tables, from
        the whole sequence's length."""
        input_ids, labels, kwargs = super()._prepare_batch(batch, labels)
        kwargs[PIPELINE_TOKEN_IDS] = input_ids
        if self.cp_enabled:
            assert labels is not None
            balancer = self.model_parts[0]._cp_load_balancer
            length = input_ids.shape[1]
            input_ids, labels = balancer.batch_shard(
                inputs=[input_ids, labels], seq_dims=[1, 1], pad_values=[0, self.label_ignore_index]
            )
            kwargs |= {"cp_already_sharded": True, "cp_original_seq_len": length}
        return input_ids, labels, kwargs

    def _average_grads(self, parts: list[Any]) -> None:
        """Each part's gradients averaged over the data-parallel ranks and the sequence-parallel
        ones (which hold replicas too), one all-reduce per part and group; DTensor gradients are
        left alone: their own FSDP module reduced them (the experts under expert parallelism,
        which DDP's ``replicate`` skips too)."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        from torch.distributed.tensor import DTensor

        for part in parts:
            grads = [p.grad for p in part.parameters() if p.grad is not None and not isinstance(p.grad, DTensor)]
            if not grads:
                continue
            flat = _flatten_dense_tensors(grads)
            _mean_over(flat, (self.dp_process_group, *self._cp_groups))
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(synced)

    @cached_property
    def _tp_groups(self) -> tuple[Any, ...]:
        """The tensor-parallel process group, if the mesh has one."""
        return (self.world_mesh["tp"].get_group(),) if self.tp_enabled else ()

    @cached_property
    def _cp_groups(self) -> tuple[Any, ...]:
        """The sequence-parallel process group, if the mesh has one."""
        return (self.world_mesh["cp"].get_group(),) if self.cp_enabled else ()

    def pre_train(self) -> None:
        """Check the batch against the micro-batches and build the schedule (as OLMo-core does,
        with torch's schedule)."""
        dp = get_world_size(self.trainer.dp_process_group)
        if self.trainer.global_batch_size % (self.rank_microbatch_size * dp):
            raise OLMoConfigurationError(
                f"global batch size ({self.trainer.global_batch_size:,d}) must be divisible by "
                f"micro-batch size ({self.rank_microbatch_size:,d}) x DP world size ({dp})"
            )
        assert self._pp_stages is not None
        microbatches = self.trainer.global_batch_size // dp // self.rank_microbatch_size
        self._train_pp_schedule = TorchSchedule(
            self._pp_stages, self._pp_config.schedule.value, microbatches, self._get_mesh
        )

    def _get_mesh(self, names: tuple[str, ...], layout: Any) -> Any:
        """The world mesh's slice over ``names``: where every stage's DTensors live."""
        del layout
        return self.world_mesh[names]

    def reduce_send_recv(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """The step's loss on every rank: the final stage's averaged over the data-parallel
        ranks (as OLMo-core averages it) and over the tensor- and sequence-parallel ranks (each
        holds the loss of its slice of the sequence, scaled by the degree: OLMo-core's LM head
        reduces only the loss it backpropagates), then broadcast over the pipeline group."""
        if self.pp_group_rank == self.pp_final_stage_rank:
            assert x is not None
            x.div_(self._reduce_divide_factor)
            _mean_over(x, (self.dp_process_group, *self._tp_groups, *self._cp_groups))
            x.mul_(self._reduce_divide_factor)
        else:
            x = torch.empty([], device=self.device)
        dist.broadcast(x, group=self.pp_group, group_src=self.pp_final_stage_rank)
        return x


def _mean_over(x: torch.Tensor, groups: tuple[Any, ...]) -> None:
    """``x`` averaged in place over each process group in turn (over all their ranks together,
    as each spans another mesh dimension)."""
    for group in groups:
        dist.all_reduce(x, group=group)
        x.div_(get_world_size(group))


def edit_stages_after_split(pp_config: Any, edit: Callable[[Any], None]) -> Any:
    """``pp_config`` whose ``split_model`` runs ``edit`` on each of the rank's stages after
    OLMo-core's split (a deep copy of the model per stage) and before its train module applies
    data parallelism to them: the plugins' model edits (:func:`olmx.worker.model.edit_model`),
    some of which cannot be deep-copied; each stage then initialises as a part of the whole
    model (:class:`OneModelInit`)."""
    split = pp_config.split_model

    def split_then_edit(model: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
        stages, parts = split(model, **kwargs)
        calls = init_calls(model)
        for part in parts:  # the stages hold these very modules: edits in place reach them
            edit(part)
            part.init_method = OneModelInit(part.init_method, calls, model.init_seed)
        return stages, parts

    copy = dataclasses.replace(pp_config)
    object.__setattr__(copy, "split_model", split_then_edit)
    return copy


@dataclasses.dataclass(frozen=True)
class _InitCall:
    """One call ``Transformer.init_weights`` makes on the model's ``init_method``: the method's
    name, the module it initialises (the whole model's, on the meta device) and its keyword
    arguments (``block_idx``, ``std``, ...; the generator is replaced when it is replayed)."""

    name: str
    module: Any
    kwargs: dict[str, Any]

    @property
    def key(self) -> tuple[str, int | None]:
        """Which call it is: the method and the block (None: the embeddings, the output head)."""
        return self.name, self.kwargs.get("block_idx")


class _InitRecorder:
    """An ``init_method`` that records the calls made on it and initialises nothing."""

    def __init__(self) -> None:
        self.calls: list[_InitCall] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def record(module: Any, **kwargs: Any) -> None:
            self.calls.append(_InitCall(name, module, kwargs))

        return record


def init_calls(model: Any) -> list[_InitCall]:
    """The calls the whole ``model`` (OLMo-core's ``Transformer``, on the meta device) makes on
    its ``init_method`` in ``init_weights``, in order (embeddings, each block's attention and
    feed-forward, the output head): ``init_weights`` run with a recorder as ``init_method`` and
    the model left on the meta device (its ``to_empty`` a no-op for the call), where nothing is
    drawn."""
    init_method = model.init_method
    recorder = _InitRecorder()
    model.init_method = recorder
    model.to_empty = lambda **kwargs: model  # meta stays meta: the generator needs a real device
    try:
        model.init_weights(device=torch.device("cpu"))
    finally:
        model.init_method = init_method
        del model.to_empty
    return recorder.calls


class OneModelInit:
    """A pipeline stage's ``init_method``: the stage's weights drawn as the whole model draws
    them, so that a pipelined run starts from the model a run without a pipeline starts from at
    the same seed (``trainer.seed``), whatever the stages and the schedule.

    OLMo-core initialises each stage from a generator of its own (the seed plus the stage's
    index), so stage 2's blocks got other weights than the same blocks of the one model. Here
    one generator seeded with the model's ``init_seed`` serves every call of the stage: before
    each, the calls the whole model makes before it on modules the stage does not hold
    (:func:`init_calls`) are replayed on scratch copies of those modules (materialised one at a
    time on the generator's device, then dropped), so the generator is where the one model's
    would be. Sharded parameters (FSDP, tensor parallelism) draw their whole tensor as without
    a pipeline (OLMo-core's ``_apply_init``). Not covered: weights a module draws from torch's
    global generator in its ``reset_parameters`` and no init method redraws (Engram's
    projections: on a stage after the first they differ, first loss 5.865 against 5.873).

    :param base: The stage's own init method (OLMo-core's ``InitMethod``, or a plugin's).
    :param calls: The whole model's calls, in order (:func:`init_calls`).
    :param seed: The model's ``init_seed``.
    """

    def __init__(self, base: Any, calls: list[_InitCall], seed: int) -> None:
        self.base = base
        self.calls = calls
        self.seed = seed
        self._names = {call.name for call in calls}
        self._generator: torch.Generator | None = None
        self._next = 0

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "calls", "seed", "_names") or name.startswith("__"):  # not set yet (copy)
            raise AttributeError(name)
        if name in self._names:
            return lambda module, **kwargs: self._init(name, module, kwargs)
        return getattr(self.base, name)

    def _init(self, name: str, module: Any, kwargs: dict[str, Any]) -> Any:
        import copy

        if self._generator is None:
            self._generator = torch.Generator(kwargs["generator"].device).manual_seed(self.seed)
        gen = self._generator
        while (call := self.calls[self._next]).key != (name, kwargs.get("block_idx")):
            scratch = copy.deepcopy(call.module).to_empty(device=gen.device)
            getattr(self.base, call.name)(scratch, **(call.kwargs | {"generator": gen}))
            self._next += 1
        self._next += 1
        return getattr(self.base, name)(module, **(kwargs | {"generator": gen}))


def _drop_dtensor_localizing_hooks(part: Any) -> None:
    """Remove the hooks torch's ``replicate`` puts on a module whose data-parallel mesh is a
    slice of a larger one (a pipeline's data-parallel ranks are a slice of the pp x dp mesh):
    after every forward they turn each DTensor parameter of the module into a local tensor and
    back before the next, a stop-gap for DDP over tensor-parallel weights that also rewrites the
    parameters of FSDP modules inside it (the experts under expert parallelism), which then lose
    their gradients. A replicated stage holds no tensor-parallel weights (olmx wraps
    tensor-parallel slices only in strategies that shard them, whose modules carry no such hooks),
    so the hooks have nothing to do there."""
    from torch.distributed.tensor.parallel.ddp import _localize_dtensor, _reconstruct_dtensor

    for hooks in (part._forward_pre_hooks, part._forward_hooks):
        for key in [k for k, hook in hooks.items() if hook in (_localize_dtensor, _reconstruct_dtensor)]:
            del hooks[key]


def build_pipeline_train_module(config: Any, model: Any, edit: Callable[[Any], None]) -> PipelineTrainModule:
    """:class:`PipelineTrainModule` from OLMo-core's ``TransformerTrainModuleConfig`` (with its
    ``pp_config``), its fields converted as the config's own ``build`` converts them; ``edit``
    edits each stage after the split (:func:`edit_stages_after_split`). An installation that lacks
    one of the pipeline's private seams is refused first (:func:`olmx.worker.pipeline_seams.check_seams`)."""
    check_seams()
    kwargs = config.as_dict(exclude_none=True, recurse=False)
    kwargs["pp_config"] = edit_stages_after_split(kwargs["pp_config"], edit)
    if (autocast := kwargs.pop("autocast_precision", None)) is not None:
        kwargs["autocast_precision"] = autocast.as_pt()
    assert "state_dict_save_opts" not in kwargs and "state_dict_load_opts" not in kwargs  # olmx sets neither
    return PipelineTrainModule(model=model, **kwargs)
