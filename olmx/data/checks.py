"""The plan's checks of the data and evaluation settings, and the files they name (cheaply:
headers, sizes, a sample of ids), with the plan's ``data`` rows; torch-free.

:func:`check_data_settings` checks the data settings before anything is derived from
them; :func:`default_holdout` fills ``eval.holdout_sequences=null``; :func:`check_data` checks
the corpus (or a mixture's sources); :func:`check_eval` the evaluation
against the batch geometry and the held-out slice or ``eval.data``.
"""

from __future__ import annotations

import sysconfig
from dataclasses import replace
from pathlib import Path

from olmx.config.schema import DataSource, RunConfig
from olmx.errors import ConfigError, unknown_name
from olmx.types import Mesh

#: Byte-level data (``data=stdlib``/``text``): ids 0-255 are bytes and olmx writes ``uint16``
#: caches, which OLMo-core reads as such for 257 to 65,536 ids (olmx.data.files.token_dtype).
BYTE_VOCAB = (257, 1 << 16)


def _unknown_tokenizer(name: str, data: str) -> str:
    """A tokenizer name that is neither ``bytes`` nor one OLMo-core names (those resolve to a
    file before the data checks, or are refused there), on data olmx tokenizes itself."""
    from olmx.data.tokenizer import BY_PATH, OLMO_CORE_TOKENIZERS

    known = ["bytes", *OLMO_CORE_TOKENIZERS]
    message = unknown_name("tokenizer", name, known)
    return f"{message}{' ' if message.endswith('?') else '; '}data={data} also takes a file of your own: {BY_PATH}"


def check_data_settings(run: RunConfig) -> None:
    """The data settings alone, before anything is derived from them (the held-out split
    divides by ``data.seq_len``) and before any file is read."""
    d, tok = run.data, run.data.tokenizer
    for key in ("eos_id", "pad_id", "bos_id"):
        value = getattr(tok, key)
        if value is not None and not 0 <= value < tok.vocab_size:
            raise ConfigError(f"data.tokenizer.{key}", f"{value} is outside the vocabulary [0, {tok.vocab_size})")
    if d.name == "stdlib" and not Path(sysconfig.get_paths()["stdlib"]).is_dir():
        raise ConfigError("data.name", "this Python has no standard-library sources; use data=text data.paths=[...]")
    if d.name in ("stdlib", "text") and not tok.path:  # with a tokenizer: olmx.data.tokenizer checks
        if tok.name != "bytes":
            raise ConfigError("data.tokenizer.name", _unknown_tokenizer(tok.name, d.name))
        low, high = BYTE_VOCAB
        if not low <= tok.vocab_size <= high:
            raise ConfigError(
                "data.tokenizer.vocab_size",
                f"data={d.name} is tokenized byte-level into uint16 ids: the vocabulary must be in "
                f"[{low}, {high:,}] (ids 0-255 are bytes, plus end-of-document), got {tok.vocab_size}",
            )
        if tok.eos_id < 256:
            raise ConfigError(
                "data.tokenizer.eos_id", f"{tok.eos_id} is a byte (0-255) in data={d.name}: use an id >= 256"
            )
    check_mixture(run)
    if d.name != "stdlib" and not d.paths and not d.sources:
        raise ConfigError(
            "data.paths",
            f"data={d.name} needs at least one file: data.paths=[path/to/file,...] (or named sources: "
            "data.sources.NAME.paths=[...])",
        )


def check_data(run: RunConfig, *, files_here: bool = True) -> list[tuple[str, str]]:
    """The data's files, with ``files_here`` (:func:`check_corpus`, :func:`check_sources`), of a
    run whose settings passed :func:`check_data_settings`. Returns the plan's ``data`` rows."""
    d = run.data
    if not files_here:
        return [("corpus", f"data={d.name}, on the target's machines (not read here)")]
    return check_sources(run) if d.sources else check_corpus(run)


def check_corpus(run: RunConfig) -> list[tuple[str, str]]:
    """The corpus, cheaply (headers, sizes, a sample of ids: :mod:`olmx.data.files`): its files,
    their ids (``numpy``), that it holds one optimizer step (OLMo-core cuts each token file into
    whole sequences of ``data.seq_len``; a step takes ``trainer.global_batch_size`` of them), and
    that the cache it is written to is writable. Returns the plan's ``data`` rows."""
    from olmx.data import files as tokens
    from olmx.data.tokenize import tokenized_file_rows
    from olmx.data.tokenizer import tokenizer_rows as plan_tokenizer_rows

    d, tok = run.data, run.data.tokenizer
    seq, need = d.seq_len, run.trainer.global_batch_size
    if d.name == "numpy":
        found = tokens.corpus_files(d.paths, example="*.npy")
        tokenizer_rows = tokenized_file_rows(run, found)  # olmx data tokenize's files: its tokenizer first
        files = [tokens.inspect_token_file(p, tok.vocab_size) for p in found]
        total, longest = sum(f.tokens for f in files), max(f.tokens for f in files)
        sequences = sum(f.tokens // seq for f in files)
        saved = [f for f in files if f.header]
        dtype = tokens.token_dtype(tok.vocab_size)
        kinds = [f"{len(files) - len(saved)} raw {dtype}"] if len(saved) < len(files) else []
        kinds += [f"{len(saved)} np.save'd {'/'.join(sorted({f.dtype for f in saved}))}"] if saved else []
        rows = [("corpus", f"{len(files)} file(s) ({', '.join(kinds)}), {total:,} tokens"), *tokenizer_rows]
        if saved:
            root = tokens.check_cache_dir(d)
            rows.append(("np.save'd files", f"read through their header, copied once as raw {dtype} into {root}"))
        if total == 0:
            raise ConfigError("data.paths", "the corpus is empty: its files hold no token ids")
        if longest < seq:
            raise ConfigError(
                "data.seq_len",
                f"{seq:,} tokens per sequence is longer than every file of the corpus (the longest holds "
                f"{longest:,} tokens; OLMo-core cuts each file into whole sequences)",
            )
    else:
        paths = tokens.stdlib_files() if d.name == "stdlib" else tokens.corpus_files(d.paths)
        total = tokens.byte_corpus_tokens(paths)
        if total == len(paths):
            raise ConfigError("data.paths", "the corpus is empty: its files hold no bytes")
        kind, tokenizer_rows = "byte-level tokens", []
        if tok.path:  # exact once cached, else a bound: nothing is tokenized at plan time
            total, exact = tokens.tokenizer_corpus_tokens(d, paths)
            kind = "tokens" if exact else "tokens at most (one per byte until the first run tokenizes them)"
            tokenizer_rows = plan_tokenizer_rows(run)
        if total < seq:
            raise ConfigError(
                "data.seq_len",
                f"{seq:,} tokens per sequence is longer than the corpus ({total:,} {kind})",
            )
        sequences = total // seq
        root = tokens.check_cache_dir(d)
        rows = [("corpus", f"{len(paths):,} file(s), {total:,} {kind}, cached in {root}"), *tokenizer_rows]
    if sequences < need:
        raise ConfigError(
            "data.paths",
            f"the corpus ({total:,} tokens) makes {sequences:,} sequence(s) of data.seq_len={seq}; one "
            f"optimizer step needs trainer.global_batch_size={need} sequences = {need * seq:,} tokens",
        )
    steps, max_steps = sequences // need, run.trainer.max_steps
    repeats = (
        f" (trainer.max_steps={max_steps} repeats the data {max_steps / steps:.2f} times)" if max_steps > steps else ""
    )
    rows.append(("sequences", f"{sequences:,} x {seq:,} tokens = {steps:,} steps per epoch{repeats}"))
    return rows


def _message(exc: ConfigError) -> str:
    """A ConfigError's message without its field (to raise it again under another field)."""
    return str(exc).removeprefix(f"{exc.field}: ")


def check_mixture(run: RunConfig) -> None:
    """``data.sources`` settings, before any file is read: not with ``data.paths`` nor the
    built-in stdlib corpus, each source with files and a positive weight."""
    d = run.data
    if not d.sources:
        return
    if d.paths:
        raise ConfigError(
            "data.sources", "set data.paths or data.sources, not both (the sources replace data.paths: data.paths=[])"
        )
    if d.name == "stdlib":
        raise ConfigError("data.sources", "data=stdlib is one built-in corpus; a mixture needs data=text or data=numpy")
    for name, source in d.sources.items():
        if not source.paths:
            raise ConfigError(f"data.sources.{name}.paths", "a source needs at least one file: [path/to/file,...]")


def check_sources(run: RunConfig) -> list[tuple[str, str]]:
    """A mixture's files, source by source (as :func:`check_corpus`, errors naming
    ``data.sources.NAME.paths``; a file belongs to one source), and what each source gives the
    run: OLMo-core asks ``int(run tokens x share)`` tokens of it, repeating a source that has
    fewer (more than one epoch is flagged). Returns the plan's ``data`` rows."""
    from olmx.data import files as tokens
    from olmx.data import splits as sources

    d, tok, seq = run.data, run.data.tokenizer, run.data.seq_len
    owner: dict[Path, str] = {}
    for name, source in d.sources.items():
        field = f"data.sources.{name}.paths"
        try:
            files = tokens.corpus_files(source.paths, example="*.npy" if d.name == "numpy" else "*")
            if d.name == "numpy":
                for path in files:
                    tokens.inspect_token_file(path, tok.vocab_size)
            elif tok.path:  # decoded by a tokenizer: UTF-8 text only
                tokens.check_text(files)
        except ConfigError as exc:
            raise ConfigError(field, _message(exc)) from None
        for path in files:
            other = owner.setdefault(path.absolute(), name)
            if other != name:
                raise ConfigError(
                    field, f"'{path}' is also in data.sources.{other}.paths; a file belongs to one source"
                )
    if d.name != "numpy":
        tokens.check_cache_dir(d)
    split = sources.planned_split(run, sources.holdout_count(run))
    run_tokens = run.trainer.max_steps * run.trainer.global_batch_size * seq
    rows = [
        (
            "mixture",
            f"{len(split)} sources, {run_tokens:,} tokens over the run (trainer.max_steps={run.trainer.max_steps} "
            f"x {run.trainer.global_batch_size * seq:,}), sampled by OLMo-core's source mixture",
        )
    ]
    for s in split:
        weight = d.sources[s.name].weight
        train = sum(s.train_tokens)
        if not train:
            why = f", all held out for evaluation (eval.holdout_sequences gives it {s.held_out})" if s.held_out else ""
            raise ConfigError(
                f"data.sources.{s.name}.paths",
                f"the source holds {s.sequences:,} whole sequence(s) of data.seq_len={seq}{why}; "
                "it needs at least one to train on",
            )
        gives = round(run_tokens * s.share / seq) * seq  # OLMo-core rounds to whole sequences
        epochs = gives / train
        held = f", {s.held_out:,} held out" if s.held_out else ""
        flag = f" -- REPEATED: each of its tokens is trained on {epochs:.2f} times" if epochs > 1 else ""
        rows.append(
            (
                f"source {s.name}",
                f"{len(s.paths)} array(s), {sum(s.tokens):,} tokens ({train // seq:,} sequences to train on{held}), "
                f"weight {weight:g} = {s.share:.1%}: ~{gives:,} tokens over the run = {epochs:.2f} epochs{flag}",
            )
        )
    return rows


def check_eval(run: RunConfig, mesh: Mesh, *, files_here: bool = True, off: str = "") -> list[tuple[str, str]]:
    """The ``eval`` settings against the batch geometry; with ``files_here`` also ``eval.data``'s
    files, or that the held-out slice leaves one optimizer step of training data (each source of a
    mixture at least one sequence). Evaluation runs in whole global batches of
    ``trainer.micro_batch_size`` x data-parallel ranks sequences (fewer per rank where fewer are
    evaluated); ``off`` is why the default turned evaluation off. Returns the plan's ``data`` rows."""
    from olmx.data import splits as sources

    e, seq = run.eval, run.data.seq_len
    if not sources.eval_on(run):
        return [("evaluation", off or "off (eval.interval)")]
    dp = mesh.dp
    if e.max_sequences is not None and e.max_sequences < dp:
        raise ConfigError(
            "eval.max_sequences",
            f"{e.max_sequences} is less than one sequence per data-parallel rank ({dp}), or null for all",
        )
    if not e.data and sources.holdout_count(run) < 1:
        raise ConfigError(
            "eval.holdout_sequences",
            f"must be at least 1 to evaluate on a held-out slice, got {e.holdout_sequences} "
            "(or evaluate on eval.data=[...], or switch evaluation off with eval.interval=0)",
        )
    when = f"every {e.interval} steps and at step {run.trainer.max_steps}"
    if not files_here:
        return [("evaluation", f"{when}, on the target's machines (files not read here)")]
    if e.data:
        available, what, rows = _eval_data(run), "eval.data", []
        source = "eval.data"
    else:
        rows = _held_out(run)
        available, what = sources.holdout_count(run), "eval.holdout_sequences"
        source = "the held-out slice"
    limit = min(available, e.max_sequences or available)
    batch = sources.eval_batch(run.trainer.micro_batch_size, dp, limit)
    count = limit // batch * batch
    if not count:
        raise ConfigError(
            what,
            f"{available:,} sequence(s) of data.seq_len={seq} are fewer than the {dp} data-parallel ranks "
            "that evaluate them (one sequence each at least)",
        )
    rows.insert(
        0,
        (
            "evaluation",
            f"{when}: loss and perplexity of {count:,} sequences of {source} ({count // batch} batch(es) of {batch})",
        ),
    )
    return rows


def default_holdout(run: RunConfig, *, files_here: bool) -> tuple[RunConfig, str]:
    """``eval.holdout_sequences=null``: the run with :data:`~olmx.data.splits.DEFAULT_HOLDOUT`
    sequences held out, or with evaluation off (and the plan's row saying why) where the training
    data cannot spare them and still fill one optimizer step (each source of a mixture one
    sequence). Files that cannot be read are left to the data checks, which name them. Returns the
    run and why evaluation is off ("" where it is not turned off)."""
    from olmx.data import splits as sources

    e, d = run.eval, run.data
    if e.holdout_sequences is not None or e.data or not sources.eval_on(run):
        return run, ""
    held = replace(run, eval=replace(e, holdout_sequences=sources.DEFAULT_HOLDOUT))
    if not files_here:
        return held, ""
    try:
        split = sources.planned_split(run, sources.DEFAULT_HOLDOUT)
    except (OSError, ConfigError):
        return held, ""
    if sources.short_of_training(split, run) is None:
        return held, ""
    total = sum(s.sequences for s in split)
    why = (
        f"off: the training data's {total:,} sequences of data.seq_len={d.seq_len} cannot spare "
        f"{sources.DEFAULT_HOLDOUT} to hold out and still fill an optimizer step (trainer.global_batch_size="
        f"{run.trainer.global_batch_size}); evaluate on eval.data=[...] or set eval.holdout_sequences"
    )
    return replace(run, eval=replace(e, interval=0)), why


def _eval_data(run: RunConfig) -> int:
    """Whole sequences of ``eval.data``'s files (checked as training files are, errors naming
    ``eval.data``), tokenized like the training data."""
    from olmx.data import files as tokens
    from olmx.data import splits as sources

    d, seq = run.data, run.data.seq_len
    kind = DataSource.numpy if d.name == DataSource.numpy else DataSource.text
    try:
        files = tokens.corpus_files(run.eval.data, example="*.npy" if kind == "numpy" else "*")
        if kind == "numpy":
            for path in files:
                tokens.inspect_token_file(path, d.tokenizer.vocab_size)
    except ConfigError as exc:
        raise ConfigError("eval.data", _message(exc)) from None
    arrays = sources.array_tokens(replace(d, name=kind, sources={}), run.eval.data)
    return sum(n // seq for _, n in arrays)


def _held_out(run: RunConfig) -> list[tuple[str, str]]:
    """The held-out slice cut from the training data (:mod:`olmx.data.splits`): it must leave
    one optimizer step to train on (a mixture: each source a sequence, checked by
    :func:`check_sources`). Returns the plan's row."""
    from olmx.data import splits as sources

    d, seq, need = run.data, run.data.seq_len, run.trainer.global_batch_size
    held = sources.holdout_count(run)
    split = sources.planned_split(run, held)
    train = sum(sum(s.train_tokens) for s in split) // seq
    if not d.sources and sources.short_of_training(split, run):
        raise ConfigError(
            "eval.holdout_sequences",
            f"holding out {held:,} of the corpus's {train + held:,} sequences leaves {train:,}, less than one "
            f"optimizer step (trainer.global_batch_size={need}); hold out fewer or evaluate on eval.data=[...]",
        )
    per_source = f" ({', '.join(f'{s.name} {s.held_out:,}' for s in split)})" if d.sources else ""
    return [
        (
            "held out",
            f"{held:,} sequences x {seq:,} tokens = {held * seq:,} tokens from the end of the training data"
            f"{per_source}, never trained on",
        )
    ]
