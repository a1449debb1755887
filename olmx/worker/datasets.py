"""Plan -> OLMo-core training dataset and held-out evaluator (call inside the distributed env).

Training reads OLMo-core's ``NumpyFSLDatasetMixture`` (:class:`ArrayHeadsDataset`): the first
``n`` tokens of each array, ``n`` from :func:`olmx.data.splits.split` (every whole sequence
before the held-out ones). A mixture (``data.sources``) gets its ``n`` per array from OLMo-core's
``SourceMixtureDatasetConfig``, which is told each array holds only those tokens, so it never
samples the held-out slice.

Evaluation is OLMo-core's ``EvaluatorCallback`` with an ``LMEvaluator`` (per-token CE loss and
perplexity, reduced over the data-parallel ranks) over an FSL dataset of the held-out
sequences (copied once into the cache, :func:`write_holdout`) or of ``eval.data``; it runs the
model through the train module's ``eval_batch`` (the same forward, Engram's token ids
included). OLMo-core's ``LMEvaluatorCallbackConfig`` is not used: it takes only a padded
dataset (one instance per document), not sequences cut as training cuts them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo_core.data.numpy_dataset import NumpyFSLDatasetMixture
from olmo_core.data.source_mixture import SourceMixtureDatasetConfig
from olmo_core.eval.lm_evaluator import LMEvaluator
from olmo_core.train.callbacks import EvaluatorCallback

from olmx.config.schema import DataSource, InstanceFilter
from olmx.data.splits import (
    SourceSplit,
    eval_batch,
    holdout_count,
    raw_tokens,
    shares,
    short_of_training,
    source_paths,
    split,
)
from olmx.errors import ConfigError
from olmx.metrics import HELDOUT_EVALUATOR, HELDOUT_LABEL
from olmx.plan import Plan

#: The label of the evaluated data in OLMo-core's metric names (``eval/lm/heldout/CE loss``,
#: which :data:`olmx.metrics.RENAMED` names ``eval/loss``).
EVAL_LABEL = HELDOUT_LABEL


class HeldOutLMEvaluator(LMEvaluator):
    """OLMo-core's ``LMEvaluator`` whose loss is the mean over the positions that have a
    target, as the training loss is. OLMo-core's averages every position of each sequence, the
    last included, which has no target (the cross entropy gives it 0): its value is
    ``(seq_len - 1) / seq_len`` of the mean, and trackers received that one while
    ``metrics.jsonl`` had the corrected one (5.3948 against 5.4804 at seq_len 64). The
    held-out and ``eval.data`` sequences are whole (no padding, no label mask), so exactly one
    position per sequence lacks a target and the mean is OLMo-core's value x
    ``seq_len / (seq_len - 1)``, reduced over all ranks as OLMo-core reduces it."""

    def __init__(self, *, seq_len: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq_len = seq_len

    def compute_metrics(self) -> dict[str, Any]:
        """OLMo-core's metrics with the loss (and perplexity) over the positions with a target."""
        out = super().compute_metrics()
        for key in [k for k in out if k.endswith("/CE loss")]:
            out[key] = out[key] * (self.seq_len / (self.seq_len - 1))
            out[key.removesuffix("CE loss") + "PPL"] = out[key].exp()
        return out


@dataclass
class TrainOnlySourceMixtureConfig(SourceMixtureDatasetConfig):
    """OLMo-core's source mixture over arrays of which only the first ``available[path]``
    tokens may be trained on (the held-out sequences follow them): it counts, allocates and
    caps every path by those tokens instead of the file's size."""

    #: Array path -> tokens training may read from its start.
    available: dict[str, int] = field(default_factory=dict)

    def _count_tokens_for_file(self, path: Any, npdtype: Any) -> int:
        return self.available[str(path)]


def source_arrays(plan: Plan) -> dict[str, list[tuple[str, int]]]:
    """``name -> [(array path, tokens), ...]``: the raw token arrays OLMo-core reads for each
    source (byte-level caches written first where needed)."""
    from olmx.data.files import token_files

    data = plan.run.data
    out = {}
    for name, paths in source_paths(data).items():
        arrays = token_files(dataclasses.replace(data, paths=paths, sources={}))
        out[name] = [(p, raw_tokens(p, data.tokenizer.vocab_size)) for p in arrays]
    return out


def data_split(plan: Plan) -> list[SourceSplit]:
    """The run's sources with the held-out sequences of :func:`olmx.data.splits.split`.
    The plan checked them from file sizes; text tokenized with ``data.tokenizer.path`` is known
    exactly only now: a held-out slice that leaves too little to train on is refused here."""
    run = plan.run
    splits = split(source_arrays(plan), shares(run.data), seq_len=plan.batch.seq_len, holdout=holdout_count(run))
    if (s := short_of_training(splits, run)) is not None:
        of = f"source {s.name}'s" if run.data.sources else "the corpus's"
        need = 1 if run.data.sources else plan.batch.global_seqs
        raise ConfigError(
            "eval.holdout_sequences",
            f"holding out {s.held_out:,} of {of} {s.sequences:,} tokenized sequences leaves fewer than "
            f"{need} to train on; hold out fewer",
        )
    return splits


def tokenizer_config(plan: Plan) -> Any:
    """OLMo-core's ``TokenizerConfig`` of the run's token ids."""
    from olmo_core.data import TokenizerConfig

    tok = plan.run.data.tokenizer
    return TokenizerConfig(
        vocab_size=tok.vocab_size,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        bos_token_id=tok.bos_id,
        identifier=tok.name,
    )


class ArrayHeadsDataset(NumpyFSLDatasetMixture):
    """OLMo-core's ``NumpyFSLDatasetMixture``: the first ``path_offset_index[(path, i)]`` tokens
    of each array, cut into sequences read contiguously from the array's start (as
    ``NumpyFSLDataset`` reads them). ``prepare`` skips the mixture's document-index pass: it
    writes indices the dataset never reads, and fails on an array without an end-of-document id."""

    def prepare(self) -> None:
        len(self)


def instance_source(dataset: Any, index: int) -> tuple[str, int]:
    """The token file an FSL dataset instance is read from and the token offset it starts at
    (OLMo-core's ``NumpyFSLDataset.__getitem__``: the array whose ``offsets`` range holds the
    index, ``sequence_length`` tokens from the instance's position in it). The file is the
    one OLMo-core reads: a raw token file as given, else its copy or byte-level cache."""
    import bisect

    offsets = dataset.offsets
    i = bisect.bisect_right([start for start, _ in offsets], index) - 1
    start, end = offsets[i]
    if not start <= index < end:
        raise IndexError(f"instance {index} is outside the dataset's {len(dataset)} instances")
    return str(dataset.paths[i]), (index - start) * dataset.sequence_length


def instance_filter_config(f: InstanceFilter | None) -> Any:
    """OLMo-core's ``InstanceFilterConfig`` for ``data.instance_filter`` (None: off)."""
    from olmo_core.data import InstanceFilterConfig

    if f is None:
        return None
    return InstanceFilterConfig(
        repetition_max_period=f.max_period, repetition_min_period=f.min_period, repetition_max_count=f.max_count
    )


def build_train_dataset(plan: Plan, splits: list[SourceSplit], work_dir: Path) -> Any:
    """The training dataset: the arrays' tokens before their held-out sequences, all of them;
    of a mixture, what OLMo-core's source mixture samples for ``trainer.max_steps`` optimizer
    steps (each array's first tokens, as many as the source's share needs)."""
    import numpy as np
    from olmo_core.data import NumpyFSLDatasetConfig
    from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureList

    run, tokenizer, seq = plan.run, tokenizer_config(plan), plan.batch.seq_len
    dtype = np.dtype(NumpyFSLDatasetConfig(tokenizer=tokenizer, sequence_length=seq).get_dtype()).type
    if not run.data.sources:
        (only,) = splits
        paths: list[Any] = list(only.paths)
        index = {(p, i): n for i, (p, n) in enumerate(zip(only.paths, only.train_tokens, strict=True))}
    else:
        requested = run.trainer.max_steps * plan.batch.global_tokens
        sources = []
        for s in splits:
            needed = int(requested * s.share)  # what OLMo-core asks of the source
            sources.append(
                SourceMixtureConfig(
                    source_name=s.name,
                    target_ratio=s.share,
                    paths=list(s.paths),
                    # Repeated as often as its share needs (the plan shows the epochs, > 1 flagged).
                    max_repetition_ratio=max(1.0, float(math.ceil(needed / sum(s.train_tokens)))),
                )
            )
        mixture = TrainOnlySourceMixtureConfig(
            source_list=SourceMixtureList(sources=sources),
            requested_tokens=requested,
            global_batch_size=plan.batch.global_tokens,
            seed=run.data_seed,
            render_tables=False,
            quiet=True,
            available={p: n for s in splits for p, n in zip(s.paths, s.train_tokens, strict=True)},
        ).build(npdtype=dtype, sequence_length=seq)
        mixture.filter_zero_token_paths = True  # as NumpyFSLDatasetConfig.build does
        paths, index = mixture.to_paths(), mixture.to_index()
    dataset = ArrayHeadsDataset(
        *paths,
        path_offset_index=index,
        seed=run.data_seed,
        sequence_length=seq,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        vocab_size=tokenizer.vocab_size,
        dtype=dtype,
        bos_token_id=tokenizer.bos_token_id,
        instance_filter_config=instance_filter_config(run.data.instance_filter),
    )
    dataset.work_dir = work_dir
    return dataset


def write_holdout(splits: list[SourceSplit], plan: Plan) -> str:
    """The held-out sequences of every source, in order, as one raw token array in the cache
    (named after the arrays, their sizes and what is held out; written once, a file lock makes
    concurrent ranks wait for the first writer)."""
    import numpy as np
    from filelock import FileLock

    from olmx.data.files import cache_dir, token_dtype
    from olmx.writable import atomic_file

    data, seq = plan.run.data, plan.batch.seq_len
    dtype = np.dtype(token_dtype(data.tokenizer.vocab_size))
    key = hashlib.sha256(f"{seq}|{dtype.str}|v1".encode())
    for s in splits:
        for path, held in zip(s.paths, s.held, strict=True):
            st = os.stat(path)
            key.update(f"{Path(path).absolute()}|{st.st_size}|{st.st_mtime_ns}|{held}\n".encode())
    root = cache_dir(data)
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"heldout-{key.hexdigest()[:16]}.{dtype.name}"
    with FileLock(str(out) + ".lock"):
        if out.exists():
            return str(out)
        with atomic_file(out) as f:
            for s in splits:
                for path, tokens, held in zip(s.paths, s.tokens, s.held, strict=True):
                    end = tokens // seq * seq
                    ids = np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)) if held else None
                    if ids is not None:
                        f.write(np.asarray(ids[end - held * seq : end]).tobytes())
    return str(out)


def eval_arrays(plan: Plan, splits: list[SourceSplit]) -> list[str]:
    """The arrays the evaluator reads: ``eval.data``'s (tokenized like the training data), or
    the held-out copy."""
    from olmx.data.files import token_files

    run = plan.run
    if run.eval.data:
        data = run.data
        kind = DataSource.numpy if data.name == DataSource.numpy else DataSource.text
        return token_files(dataclasses.replace(data, name=kind, paths=list(run.eval.data), sources={}))
    return [write_holdout(splits, plan)]


class HeldOutEvaluatorCallback(EvaluatorCallback):
    """OLMo-core's ``EvaluatorCallback``, evaluating in ``post_train_batch`` ahead of the
    checkpointer (priority 1), which saves there: a save flushes the step's metrics, and an
    evaluation recorded after it (in ``post_step``) would reach ``metrics.jsonl`` as a second
    record of the same step. It also evaluates under olmx's pipeline train module."""

    priority = 2

    def post_attach(self) -> None:
        """OLMo-core's check of the train module, which also takes olmx's pipeline train module
        (:meth:`olmx.worker.pipeline.PipelineTrainModule.eval_batch`)."""
        from olmx.worker.pipeline import PipelineTrainModule

        if not isinstance(self.trainer.train_module, PipelineTrainModule):
            super().post_attach()

    def post_train_batch(self) -> None:
        """Evaluate where OLMo-core's callback would in ``post_step``."""
        super().post_step()

    def post_step(self) -> None:
        """Nothing: evaluation ran in :meth:`post_train_batch`."""


def build_evaluator(
    plan: Plan, splits: list[SourceSplit], *, collator: Any, dp_process_group: Any, work_dir: Path
) -> Any:
    """OLMo-core's ``EvaluatorCallback`` with an ``LMEvaluator`` over the evaluated sequences:
    every ``eval.interval`` steps and at ``trainer.max_steps``, in global batches of
    :func:`olmx.data.splits.eval_batch` sequences, at most ``eval.max_sequences`` of them."""
    import numpy as np
    from olmo_core.data import NumpyFSLDataLoader, NumpyFSLDatasetConfig
    from olmo_core.data.numpy_dataset import NumpyFSLDataset
    from olmo_core.distributed.utils import get_fs_local_rank, get_rank, get_world_size
    from olmo_core.train import Duration
    from olmo_core.utils import get_default_device

    run, tokenizer = plan.run, tokenizer_config(plan)
    paths = eval_arrays(plan, splits)
    dtype = NumpyFSLDatasetConfig(tokenizer=tokenizer, sequence_length=plan.batch.seq_len).get_dtype()
    dataset = NumpyFSLDataset(
        *paths,
        sequence_length=plan.batch.seq_len,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        vocab_size=tokenizer.vocab_size,
        dtype=np.dtype(dtype).type,
        bos_token_id=tokenizer.bos_token_id,
        metadata=[{"label": EVAL_LABEL}] * len(paths),
        include_instance_metadata=True,
    )
    dataset.work_dir = work_dir
    dataset.prepare()
    device = get_default_device()
    limit = run.eval.max_sequences
    batch_seqs = eval_batch(plan.batch.micro_seqs, plan.mesh.dp, min(len(dataset), limit or len(dataset)))
    loader = NumpyFSLDataLoader(
        dataset,
        global_batch_size=batch_seqs * plan.batch.seq_len,
        collator=collator,
        work_dir=work_dir,
        seed=run.data_seed,
        dp_world_size=get_world_size(dp_process_group),
        dp_rank=get_rank(dp_process_group),
        fs_local_rank=get_fs_local_rank(),
        target_device_type=device.type,
    )
    evaluator = HeldOutLMEvaluator(
        seq_len=plan.batch.seq_len, name=HELDOUT_EVALUATOR, batches=loader, labels=[EVAL_LABEL], device=device
    )
    return HeldOutEvaluatorCallback(
        evaluators=[evaluator],
        eval_interval=run.eval.interval,
        fixed_steps=[run.trainer.max_steps],
        eval_duration=Duration.steps(limit // batch_seqs) if limit else Duration.epochs(1),
        log_interval=1 << 30,  # one log line per evaluation (its metrics), not one per batch
    )


def build_downstream(plan: Plan, *, dp_process_group: Any) -> Any:
    """OLMo-core's ``DownstreamEvaluator`` for each task of ``eval.downstream``, in one evaluator
    callback with the held-out loss's schedule (every ``eval.interval`` steps and at
    ``trainer.max_steps``), each task evaluated whole. The tokenizer is the run's file (olmo_eval's
    ``HFTokenizer`` reads a path as it is); batches are ``trainer.micro_batch_size`` x
    ``data.seq_len`` tokens per rank, as the plan costed them (:mod:`olmx.plan.downstream`)."""
    from olmo_core.train import Duration
    from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator
    from olmo_core.train.train_module import EvalBatchSpec
    from olmo_core.utils import get_default_device
    from olmo_eval import HFTokenizer

    run, tok, seq = plan.run, plan.run.data.tokenizer, plan.batch.seq_len
    assert tok.path
    tokenizer = HFTokenizer(tok.path, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id)
    spec = EvalBatchSpec(plan.batch.micro_seqs * seq, max_sequence_length=seq)
    evaluators = [
        DownstreamEvaluator(
            name="downstream",
            task=task,
            batch_spec=spec,
            tokenizer=tokenizer,
            device=get_default_device(),
            dp_process_group=dp_process_group,
        )
        for task in run.eval.downstream
    ]
    return HeldOutEvaluatorCallback(
        evaluators=evaluators,
        eval_interval=run.eval.interval,
        fixed_steps=[run.trainer.max_steps],
        eval_duration=Duration.epochs(1),
        log_interval=1 << 30,
    )
