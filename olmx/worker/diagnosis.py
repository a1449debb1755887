"""A non-finite or spiking step's diagnosis: which ranks, which module, which documents, and why.

When the step guard (:class:`olmx.worker.faults.TrainingGuard`) finds a step non-finite, or its
loss a spike (``trainer.spike_zscore``), it runs before the optimizer step: the parameters are
still the ones the step's forward passes used. Every rank then, in the same order (so the
collectives a sharded model's forward makes match):

1. takes its own loss of the step (the model's forward outputs, kept by reference while the
   step runs: the only work a good step does for this);
2. replays its micro-batches under ``torch.no_grad`` through the model with a forward hook on
   every module (:func:`replay`): the first module, in the order their forward passes finish
   (a child before its parent), whose output holds a non-finite value, the rows (sequences) of
   that output that do, and the replayed loss;
3. replays the micro-batches of the previous data-parallel rank, read again from the dataset
   at the data loader's global indices of the step (:func:`rank_indices`): every rank's data is
   also replayed on another rank;
4. names the token file and offset of each of its sequences
   (:func:`olmx.worker.datasets.instance_source`).

One ``all_gather_object`` of these findings (the one collective of the diagnosis) lets rank 0
decide the verdict (:func:`verdict`, no torch) and write the event.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: The verdicts (:func:`verdict`).
DATA = "data"
NUMERICS = "numerics"
THIS_RANK = "this rank"

#: Module-name parts that wrappers (activation checkpointing, ``torch.compile``, FSDP) add.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module", "module")


@dataclass(frozen=True)
class Finding:
    """One rank's side of the verdict."""

    rank: int
    #: Its own loss in the step went non-finite (or spiked).
    bad: bool
    #: Its micro-batches replayed on itself fail again (None: not replayed).
    home: bool | None
    #: Its micro-batches replayed on another rank fail again (None: not replayed elsewhere).
    away: bool | None = None
    #: The rank that replayed them elsewhere.
    away_on: int | None = None


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def verdict(findings: list[Finding]) -> tuple[str, list[int], str]:
    """``(verdict, failing ranks, reason)`` from every rank's finding:

    - ``numerics``: no rank's loss failed (only the gradients, in the backward pass), every rank
      failed (each on its own data), or the failing ranks' data is fine when replayed;
    - ``data``: a failing rank's micro-batches fail again when replayed elsewhere (on another
      rank; with one rank, on itself): deterministic on that input;
    - ``this rank``: one rank of several failed and its micro-batches replayed on another rank
      are fine (whether or not they fail again on that rank itself).
    """
    world = len(findings)
    failing = sorted(f.rank for f in findings if f.bad)
    if not failing:
        return NUMERICS, [], "no rank's loss failed: the gradients went non-finite in the backward pass"
    if world > 1 and len(failing) == world:
        return NUMERICS, failing, "every rank failed, each on its own data"
    by_rank = {f.rank: f for f in findings}

    def again(f: Finding) -> bool:
        return bool(f.away if f.away is not None else f.home)

    for r in failing:
        f = by_rank[r]
        if again(f):
            where = f"on rank {f.away_on}" if f.away is not None else "on it"
            return DATA, failing, f"rank {r}'s micro-batches fail again when replayed {where}"
    if world == 1:
        return NUMERICS, failing, "the micro-batches do not fail again when replayed"
    elsewhere = [by_rank[r] for r in failing if by_rank[r].away is not None]
    tried = ", ".join(f"rank {f.rank}'s on rank {f.away_on}" for f in elsewhere) or "not replayed elsewhere"
    if len(failing) == 1:
        (r,) = failing
        own = {True: "; they fail again on rank %d itself" % r, False: "", None: ""}[by_rank[r].home]
        return THIS_RANK, failing, f"only rank {r} failed; its micro-batches replayed elsewhere are fine ({tried}){own}"
    return NUMERICS, failing, f"{_ranks(failing)} failed; their micro-batches replayed elsewhere are fine ({tried})"


def module_names(model: Any) -> dict[Any, str]:
    """Every module of ``model`` -> its name without wrapper parts (``blocks.0.attention``;
    the model itself is ``model``)."""
    out = {}
    for name, module in model.named_modules():
        parts = [p for p in name.split(".") if p and p not in _WRAPPER_PARTS]
        out[module] = ".".join(parts) or "model"
    return out


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def nonfinite_rows(output: Any) -> list[int] | None:
    """None if every floating tensor of a module's output is finite; else the rows (first
    dimension: the micro-batch's sequences) of the first that is not, where it has rows."""
    import torch
    from olmo_core.distributed.utils import get_local_tensor

    for t in _tensors(output):
        t = get_local_tensor(t)
        if not t.is_floating_point() or bool(torch.isfinite(t).all()):
            continue
        if t.dim() < 2:
            return []
        return torch.nonzero(~torch.isfinite(t.detach()).flatten(1).all(dim=1)).flatten().tolist()
    return None


@contextmanager
def _eager() -> Iterator[None]:
    """Compiled modules run eagerly (hooks on the modules inside them fire)."""
    import torch

    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        yield
        return
    with stance("force_eager"):
        yield


def replay(train_module: Any, batch: dict[str, Any], micro_seqs: int) -> dict[str, Any]:
    """The rank batch ``batch`` through the model again, under ``torch.no_grad``, in micro-batches
    of ``micro_seqs`` sequences, with a forward hook on every module: ``module`` (the first whose
    output is non-finite, or None), ``sequences`` (that output's non-finite rows, as positions in
    ``batch``) and ``loss`` (the mean cross-entropy over the batch, as the step computed it;
    None where non-finite)."""
    import torch
    from olmo_core.data.utils import get_labels, split_batch
    from olmo_core.distributed.utils import get_local_tensor
    from olmo_core.utils import move_to_device

    ignore = train_module.label_ignore_index
    batch = {k: v for k, v in batch.items() if k not in ("index", "metadata")}
    if "labels" not in batch:
        batch["labels"] = get_labels(batch, label_ignore_index=ignore)
    tokens = (batch["labels"] != ignore).sum()
    if (mask := batch.get("instance_mask")) is not None:  # as train_batch counts them
        tokens = tokens + (~mask).sum() * batch["labels"].shape[1]
    tokens = move_to_device(tokens, train_module.device)
    model = train_module.model
    names = module_names(model)
    found: dict[str, Any] = {}
    where = {"micro_batch": 0}

    def hook(module: Any, args: Any, output: Any) -> None:
        if found:
            return
        rows = nonfinite_rows(output)
        if rows is not None:
            found["module"] = names.get(module, type(module).__name__)
            found["sequences"] = [where["micro_batch"] * micro_seqs + r for r in rows]

    handles = [m.register_forward_hook(hook) for m in names]
    loss = torch.zeros((), device=train_module.device)
    try:
        with torch.no_grad(), _eager():
            for i, micro in enumerate(split_batch(batch, micro_seqs)):
                where["micro_batch"] = i
                input_ids, labels, kwargs = train_module._prepare_batch(move_to_device(micro, train_module.device))
                out = train_module.model_forward(
                    input_ids,
                    labels=labels,
                    ignore_index=ignore,
                    loss_reduction="sum",
                    z_loss_multiplier=train_module.z_loss_multiplier,
                    loss_div_factor=tokens,
                    return_logits=False,
                    **kwargs,
                )
                loss += get_local_tensor(out.ce_loss.detach()).float()
    finally:
        for h in handles:
            h.remove()
    value = float(loss)
    return {
        "module": found.get("module"),
        "sequences": found.get("sequences", []),
        "loss": value if math.isfinite(value) else None,
    }


def rank_indices(loader: Any, dp_rank: int) -> list[int]:
    """The dataset instances of data-parallel rank ``dp_rank``'s batch of the step being trained
    (the batch ``loader`` yielded last), as OLMo-core's ``NumpyFSLDataLoader`` slices its global
    indices (``__getitem__``: batches of the global batch size, every ``dp_world_size``-th
    instance from ``dp_rank``)."""
    per_batch = loader.global_batch_size // loader.dataset.sequence_length
    indices = loader.get_global_indices()[: loader.total_size].reshape(-1, per_batch)
    return [int(i) for i in indices[loader.batches_processed - 1, dp_rank :: loader.dp_world_size]]


def read_batch(loader: Any, indices: list[int]) -> dict[str, Any]:
    """The collated batch of these dataset instances, as the data loader makes it."""
    return loader.collator([dict(loader.dataset[i], index=i) for i in indices])


def diagnose(
    train_module: Any,
    loader: Any,
    batch: dict[str, Any] | None,
    *,
    bad: Callable[[float | None], bool],
    local_loss: float | None,
    local_known: bool = True,
) -> dict[str, Any]:
    """This rank's findings (module doc, steps 1-4); ``bad(loss)`` says whether a loss (None:
    non-finite) counts as the failure (non-finite, or a spike); without the rank's own loss
    (``local_known`` false) its replay on itself decides. Errors are reported in the
    finding, not raised: the guard then goes on as without a diagnosis."""
    from olmo_core.distributed.utils import get_rank

    from olmx.worker.datasets import instance_source

    rank = get_rank()
    dp_rank, dp_world = getattr(loader, "dp_rank", 0), getattr(loader, "dp_world_size", 1)
    out: dict[str, Any] = {"rank": rank, "dp_rank": dp_rank, "loss": local_loss, "bad": local_known and bad(local_loss)}
    if batch is None or not hasattr(train_module, "model_forward") or not hasattr(train_module, "model"):
        out["error"] = "no replay: the step's batch or the model's forward is not available here"
        return out
    index = batch.get("index")
    own = [int(i) for i in index.tolist()] if index is not None else []
    try:
        out["documents"] = [list(instance_source(loader.dataset, i)) for i in own]
    except Exception as e:  # noqa: BLE001 - a dataset without files: no documents, still a verdict
        out["documents"] = []
        out["error"] = f"documents: {type(e).__name__}: {e}"
    # Sequences per micro-batch, as the train module splits the rank's batch.
    micro_seqs = max(1, train_module.rank_microbatch_size // batch["input_ids"].shape[1])
    # Every rank makes the same forward calls (home, then away), whatever it finds.
    other, away_of = batch, None
    if dp_world > 1:
        try:
            if rank_indices(loader, dp_rank) == own:  # OLMo-core's slicing, checked on our own batch
                away_of = (dp_rank - 1) % dp_world
                other = read_batch(loader, rank_indices(loader, away_of))
        except Exception as e:  # noqa: BLE001
            out["error"] = f"the other rank's batch: {type(e).__name__}: {e}"
    try:
        home = replay(train_module, batch, micro_seqs)
        away = replay(train_module, other, micro_seqs)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"replay: {type(e).__name__}: {e}"
        return out
    out["replay"] = {**home, "bad": bad(home["loss"]) or home["module"] is not None}
    if not local_known:
        out["bad"] = out["replay"]["bad"]
    if away_of is not None:
        out["replayed_other"] = {"dp_rank": away_of, **away, "bad": bad(away["loss"]) or away["module"] is not None}
    return out


def findings_of(gathered: list[dict[str, Any]]) -> list[Finding]:
    """:class:`Finding` of every rank from the gathered findings: rank r's data replayed
    elsewhere is the ``replayed_other`` of the rank that replayed r's data-parallel rank."""
    out = []
    for g in gathered:
        away = next(
            (o for o in gathered if o.get("replayed_other", {}).get("dp_rank") == g["dp_rank"] and o is not g),
            None,
        )
        out.append(
            Finding(
                rank=g["rank"],
                bad=bool(g["bad"]),
                home=g["replay"]["bad"] if "replay" in g else None,
                away=away["replayed_other"]["bad"] if away else None,
                away_on=away["rank"] if away else None,
            )
        )
    return out


def event_fields(gathered: list[dict[str, Any]]) -> dict[str, Any]:
    """The event's diagnosis fields from every rank's findings (rank order)."""
    gathered = sorted(gathered, key=lambda g: g["rank"])
    decided, ranks, reason = verdict(findings_of(gathered))
    module = next(
        (g["replay"]["module"] for g in gathered if g["rank"] in ranks and g.get("replay", {}).get("module")),
        None,
    )
    failing_documents = [
        g["documents"][i]
        for g in gathered
        if g["rank"] in ranks
        for i in g.get("replay", {}).get("sequences", [])
        if i < len(g.get("documents", []))
    ]
    by_rank = []
    for g in gathered:
        row = {k: g[k] for k in ("rank", "loss", "documents", "replay", "replayed_other", "error") if k in g}
        by_rank.append(row)
    return {
        "verdict": decided,
        "ranks": ranks,
        "module": module,
        "reason": reason,
        "failing_documents": failing_documents,
        "by_rank": by_rank,
    }
