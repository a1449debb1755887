"""The training data as named sources of token arrays, and the held-out slice cut from them.

A run reads one source (``data.paths``, or the stdlib corpus, named :data:`SINGLE`) or a
mixture of named sources (``data.sources``, weights normalised to shares). Each source is a
list of raw token arrays (one byte-level cache per source for ``stdlib``/``text``, the token
files for ``numpy``); OLMo-core cuts each array into whole sequences of ``data.seq_len``.

With evaluation on and no ``eval.data``, ``eval.holdout_sequences`` sequences are held out:
split over the sources by share (largest remainders, :func:`apportion`), each source's part
taken from the end of its arrays (the last array first, :func:`hold_out`). The training
dataset reads only the sequences before them (OLMo-core's ``NumpyFSLDatasetMixture`` reads
the first ``n`` tokens of each array) and the evaluator reads a copy of them, so they are
never trained on.

The plan (torch-free, token counts from file sizes and headers: :func:`array_tokens`) and the
worker (token counts of the arrays it reads) compute the split with the same :func:`split`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from olmx.config.schema import DataConfig, RunConfig

#: The name of the one source of a run without ``data.sources``.
SINGLE = "data"


#: Sequences held out for evaluation when ``eval.holdout_sequences`` is null.
DEFAULT_HOLDOUT = 32


def eval_on(run: RunConfig) -> bool:
    """Whether the run evaluates (``eval.interval`` set and not 0)."""
    return bool(run.eval.interval)


def holdout_count(run: RunConfig) -> int:
    """Sequences held out of the training data: ``eval.holdout_sequences`` when the run
    evaluates on a held-out slice (no ``eval.data``), else 0."""
    return held_out_sequences(run.eval.interval, run.eval.data, run.eval.holdout_sequences)


def held_out_sequences(interval: int | None, data: list[str], holdout: int | None) -> int:
    """:func:`holdout_count` from the ``eval`` settings' values (also of a saved plan's config;
    null is :data:`DEFAULT_HOLDOUT`)."""
    return (DEFAULT_HOLDOUT if holdout is None else holdout) if interval and not data else 0


def eval_batch(micro_seqs: int, dp: int, available: int) -> int:
    """Sequences per evaluation batch over the ``dp`` data-parallel ranks: ``micro_seqs`` per
    rank, fewer where ``available`` sequences do not fill one such batch (at least one per rank)."""
    return dp * max(1, min(micro_seqs, available // dp))


def shares(data: DataConfig) -> dict[str, float]:
    """Each source's share of the training tokens: its weight over the sum of the weights
    (``{SINGLE: 1.0}`` without ``data.sources``)."""
    if not data.sources:
        return {SINGLE: 1.0}
    total = sum(s.weight for s in data.sources.values())
    return {name: s.weight / total for name, s in data.sources.items()}


def source_paths(data: DataConfig) -> dict[str, list[str]]:
    """The configured files or globs of each source (:func:`shares` order)."""
    if not data.sources:
        return {SINGLE: list(data.paths)}
    return {name: list(s.paths) for name, s in data.sources.items()}


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` into integers that sum to it: each gets the
    floor of its quota, the rest go to the largest remainders (Hamilton's method, as
    OLMo-core's source mixtures round instances; ties to the earlier)."""
    quotas = [total * w / sum(weights) for w in weights]
    out = [int(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (out[i] - quotas[i], i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


def hold_out(sequences: Sequence[int], count: int) -> list[int]:
    """Sequences held out of each array so that the last ``count`` sequences of their
    concatenation are held out (the last array's first, then the one before, ...)."""
    out, left = [0] * len(sequences), count
    for i in reversed(range(len(sequences))):
        out[i] = min(left, sequences[i])
        left -= out[i]
    return out


@dataclass(frozen=True)
class SourceSplit:
    """One source's arrays and the sequences held out at the end of each."""

    #: The source's name (:data:`SINGLE` without ``data.sources``).
    name: str
    #: Its share of the training tokens (weights normalised).
    share: float
    #: The raw token arrays (at plan time: a label per array, the arrays are not written yet).
    paths: tuple[str, ...]
    #: Token ids in each array.
    tokens: tuple[int, ...]
    #: Sequences held out at the end of each array.
    held: tuple[int, ...]
    #: ``data.seq_len``.
    seq_len: int

    @property
    def sequences(self) -> int:
        """Whole sequences of the source (OLMo-core drops each array's remainder)."""
        return sum(t // self.seq_len for t in self.tokens)

    @property
    def held_out(self) -> int:
        """Sequences held out of the source."""
        return sum(self.held)

    @property
    def train_tokens(self) -> tuple[int, ...]:
        """Tokens of each array that training may read: its whole sequences before the held-out ones."""
        return tuple((t // self.seq_len - h) * self.seq_len for t, h in zip(self.tokens, self.held, strict=True))


def split(
    arrays: dict[str, list[tuple[str, int]]], share: dict[str, float], *, seq_len: int, holdout: int
) -> list[SourceSplit]:
    """The sources' arrays (``name -> [(path, tokens), ...]``) with ``holdout`` sequences held
    out: split over the sources by ``share``, each part from the end of its source."""
    names = list(arrays)
    per_source = apportion(holdout, [share[n] for n in names]) if holdout else [0] * len(names)
    out = []
    for name, count in zip(names, per_source, strict=True):
        paths = tuple(p for p, _ in arrays[name])
        tokens = tuple(t for _, t in arrays[name])
        held = hold_out([t // seq_len for t in tokens], count)
        out.append(
            SourceSplit(name=name, share=share[name], paths=paths, tokens=tokens, held=tuple(held), seq_len=seq_len)
        )
    return out


def planned_split(run: RunConfig, holdout: int) -> list[SourceSplit]:
    """:func:`split` of the run's sources as the plan sees them (:func:`array_tokens`: sizes and
    headers, nothing written), ``holdout`` sequences held out."""
    d = run.data
    arrays = {name: array_tokens(d, paths) for name, paths in source_paths(d).items()}
    return split(arrays, shares(d), seq_len=d.seq_len, holdout=holdout)


def short_of_training(splits: list[SourceSplit], run: RunConfig) -> SourceSplit | None:
    """The first source left too little to train on before its held-out sequences: a corpus
    needs one optimizer step (``trainer.global_batch_size`` sequences), a mixture's source one
    sequence (the mixture repeats it as its share needs). None where every source can train."""
    need = 1 if run.data.sources else run.trainer.global_batch_size
    return next((s for s in splits if sum(s.train_tokens) // s.seq_len < need), None)


def array_tokens(data: DataConfig, paths: list[str]) -> list[tuple[str, int]]:
    """``(label, tokens)`` of the arrays a source's files become, from sizes and headers alone
    (nothing is written or tokenized): each token file for ``numpy`` (files checked before); one
    cache for ``stdlib``/``text``: byte-level, every byte plus one end-of-document id per file;
    with ``data.tokenizer.path``, its exact size if the cache exists, else an upper bound
    (:func:`olmx.data.files.tokenizer_corpus_tokens`; the worker checks the real split again)."""
    from olmx.data import files as tokens

    if data.name == "numpy":
        out = []
        for path in tokens.text_files(paths):
            header = tokens.npy_header(path)
            itemsize = _itemsize(tokens.token_dtype(data.tokenizer.vocab_size))
            out.append((str(path), header.items if header else path.stat().st_size // itemsize))
        return out
    files = tokens.stdlib_files() if data.name == "stdlib" else tokens.text_files(paths)
    if data.tokenizer.path:
        count = tokens.tokenizer_corpus_tokens(data, files)[0]
    else:
        count = tokens.byte_corpus_tokens(files)
    return [(f"{data.name} cache of {len(files):,} file(s)", count)]


def raw_tokens(path: str, vocab_size: int) -> int:
    """Token ids of a raw array OLMo-core reads (its size over the dtype of the vocabulary)."""
    from olmx.data.files import token_dtype

    return Path(path).stat().st_size // _itemsize(token_dtype(vocab_size))


def _itemsize(dtype: str) -> int:
    return int(dtype.removeprefix("uint")) // 8
