"""The private parts of OLMo-core and torch that olmx's pipeline reaches (:mod:`olmx.worker.pipeline`,
the OLMo-core train-module subclass, and :mod:`olmx.worker.pipeline_schedule`, the adapter over
torch's schedules), in one table: :data:`PRIVATE_SEAMS`.

None of them is a documented API: the OLMo-core pin (``ai2-olmo-core==3.0.0``) and torch's range
are what keeps them. :func:`check_seams` (run when the pipeline's train module is built) refuses
an installation that lacks one, naming each, before any stage is built; the test
(``tests/worker/test_pipeline_seams.py``) checks the table against the installed packages and
that every private name the two modules use is in it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Seam:
    """One private part olmx relies on.

    :param owner: Where it lives: ``"package.module"`` or ``"package.module:Class"``.
    :param attribute: Its name on the owner: a function, method, property or class attribute, or
        an attribute the owner's instances set (looked up in the source of the class and its bases).
    :param use: What olmx uses it for.
    :param needs: Text the attribute's source must contain: the behaviour olmx relies on (a call
        it makes, an argument it takes).
    """

    owner: str
    attribute: str
    use: str
    needs: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.owner}.{self.attribute}"


_PIPELINE_MODULE = "olmo_core.train.train_module.transformer.pipeline_train_module:TransformerPipelineTrainModule"

#: Every private part of OLMo-core 3.0.0 and torch that olmx's pipeline modules touch.
PRIVATE_SEAMS: tuple[Seam, ...] = (
    # OLMo-core's pipeline train module (olmx.worker.pipeline.PipelineTrainModule subclasses it).
    Seam(
        _PIPELINE_MODULE,
        "_pp_stages",
        "the rank's torch PipelineStages: driven by TorchSchedule, given the mesh lookup",
    ),
    Seam(
        _PIPELINE_MODULE,
        "_train_pp_schedule",
        "replaced in pre_train by TorchSchedule (OLMo-core's driver runs only its own CUDA schedules); "
        "eval_batch runs its forward-only pass",
    ),
    Seam(_PIPELINE_MODULE, "_pp_config", "the schedule's name, for TorchSchedule"),
    Seam(_PIPELINE_MODULE, "_reduce_divide_factor", "undone and redone around averaging the reported loss"),
    Seam(_PIPELINE_MODULE, "_model_forward_context", "the evaluation forward runs under it (autocast, as training)"),
    Seam(
        _PIPELINE_MODULE,
        "_prepare_batch",
        "overridden: the token ids to every stage, the batch sharded over the sequence-parallel ranks",
    ),
    Seam(
        _PIPELINE_MODULE,
        "run_pipeline",
        "overridden (undocumented): replicas' gradients averaged once after the schedule, the losses to "
        "every rank; OLMo-core's drives the schedule through step()",
        needs=("train_pp_schedule.step(",),
    ),
    Seam(
        _PIPELINE_MODULE,
        "reduce_send_recv",
        "overridden (undocumented): the loss averaged over dp, tp and cp, broadcast over the pipeline group",
    ),
    Seam(
        "olmo_core.train.train_module:TransformerPipelineParallelConfig",
        "split_model",
        "replaced on a copy of the config (object.__setattr__): each stage edited and its init set after the split",
        needs=("model_chunk = copy.deepcopy(model)",),
    ),
    # OLMo-core's model.
    Seam(
        "olmo_core.nn.transformer.model:Transformer",
        "_cp_load_balancer",
        "shards the input ids and labels over the sequence-parallel ranks before the schedule",
    ),
    Seam(
        "olmo_core.nn.transformer.model:Transformer",
        "init_weights",
        "recorded on the meta model with a no-op to_empty and a recording init_method (OneModelInit)",
        needs=("self.to_empty(device=device)", "self.init_method.init_embeddings("),
    ),
    Seam(
        "olmo_core.nn.transformer.init",
        "_apply_init",
        "a sharded parameter draws its whole tensor, so a stage's replay draws as the one model",
        needs=("torch.zeros(x.shape",),
    ),
    # torch.
    Seam("torch._utils", "_flatten_dense_tensors", "one all-reduce per model part for the replicas' gradients"),
    Seam("torch._utils", "_unflatten_dense_tensors", "the averaged gradients back into their tensors"),
    Seam(
        "torch.distributed.tensor.parallel.ddp",
        "_localize_dtensor",
        "the forward-pre hook replicate puts on a module over a mesh slice: removed from each part",
    ),
    Seam("torch.distributed.tensor.parallel.ddp", "_reconstruct_dtensor", "its forward hook: removed too"),
    Seam("torch.nn.modules.module:Module", "_forward_pre_hooks", "the dict the hooks are removed from"),
    Seam("torch.nn.modules.module:Module", "_forward_hooks", "the dict the hooks are removed from"),
    Seam(
        "torch.distributed.pipelining.stage:_PipelineStageBase",
        "_mesh_cache",
        "where a stage looks up the mesh of a DTensor activation it receives",
    ),
    Seam(
        "torch.distributed.pipelining._utils:_MeshCache",
        "_get_mesh_cb",
        "set to the world mesh's lookup on OLMo-core's stages (its split passes no get_mesh)",
    ),
    Seam(
        "torch.distributed.pipelining.stage:PipelineStage",
        "__init__",
        "the forward-only stages pass get_mesh (a recent argument)",
        needs=("get_mesh",),
    ),
)


def _owner(path: str) -> Any:
    module, _, name = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, name.split(".")):
        obj = getattr(obj, part)
    return obj


def _source(obj: Any) -> str:
    """The source of ``obj``; for a class, of the modules of the class and its bases (an
    attribute may be set in either; a module's text is read without parsing it)."""
    if not inspect.isclass(obj):
        return inspect.getsource(obj)
    sources = []
    for module in dict.fromkeys(inspect.getmodule(o) for o in inspect.getmro(obj)):
        try:
            sources.append(inspect.getsource(module))  # type: ignore[arg-type]
        except (OSError, TypeError):  # builtins, C classes
            continue
    return "\n".join(sources)


def seam_exists(seam: Seam) -> bool:
    """``seam`` is in the installed packages: its owner imports, has the attribute (or its
    instances set it, as the owner's source shows) and its source has what ``needs`` names."""
    try:
        owner = _owner(seam.owner)
    except (ImportError, AttributeError):
        return False
    if hasattr(owner, seam.attribute):
        if not seam.needs:
            return True
        attr = inspect.getattr_static(owner, seam.attribute)
        attr = getattr(attr, "fget", None) or getattr(attr, "func", None) or attr  # property, cached_property
        text = _source(attr)
        return all(need in text for need in seam.needs)
    text = _source(owner)
    return (
        not seam.needs
        and re.search(rf"\bself\.{re.escape(seam.attribute)}\b|[\"']{seam.attribute}[\"']", text) is not None
    )


def missing_seams(seams: tuple[Seam, ...] = PRIVATE_SEAMS) -> list[Seam]:
    """The seams of ``seams`` the installed OLMo-core and torch lack."""
    return [seam for seam in seams if not seam_exists(seam)]


def check_seams(seams: tuple[Seam, ...] = PRIVATE_SEAMS) -> None:
    """Refuse an installation that lacks a seam of the pipeline, naming each (rather than an
    ``AttributeError`` in the middle of a step)."""
    missing = missing_seams(seams)
    if missing:
        from importlib.metadata import version

        lines = "; ".join(f"{seam} ({seam.use})" for seam in missing)
        raise RuntimeError(
            f"pipeline parallelism relies on private parts of OLMo-core and torch that this installation "
            f"(ai2-olmo-core {version('ai2-olmo-core')}, torch {version('torch')}) lacks: {lines}. olmx's pipeline "
            "is built for ai2-olmo-core==3.0.0 and torch>=2.11,<2.14 (olmx.worker.pipeline_seams)"
        )
