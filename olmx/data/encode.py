"""Encoding documents with a Hugging Face ``tokenizer.json``: what ``olmx data tokenize`` and
``data=text``/``stdlib`` with ``data.tokenizer.path`` share.

The ``tokenizers`` package (the ``tokenize`` extra) is imported only when a tokenizer is loaded.
Documents are encoded without the tokenizer's own post-processing; olmx puts the
beginning-of-document id before each (where the run has one) and the end-of-document id after
each, so every document is delimited the same way whatever the tokenizer's template says (the
ids come from :mod:`olmx.data.tokenizer`). Batches are encoded with ``encode_batch_fast`` (ids
only, no offsets), over ``tokenizers``' own thread pool (:func:`threads`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmx.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

#: Characters of text encoded in one batch (over tokenizers' threads).
BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class Specials:
    """The ids olmx puts around every document, and how they are stored."""

    #: Ids of the vocabulary (the largest id plus one).
    vocab_size: int
    #: Appended to every document.
    eos_id: int
    #: Padding id (recorded; never written).
    pad_id: int
    #: Put before every document (None: nothing is).
    bos_id: int | None
    #: The dtype the ids are written in (``olmx.data.files.token_dtype`` of the vocabulary).
    dtype: str


def load_tokenizer(path: str | Path, *, field: str = "--tokenizer") -> Any:
    """The ``tokenizers.Tokenizer`` of the ``tokenizer.json`` at ``path``. Raises
    :class:`ConfigError` naming ``field`` for a missing ``tokenizers`` package (naming the extra)
    or a file that it cannot load."""
    from olmx.api import require_package

    require_package("tokenizers", extra="tokenize", field=field)
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(os.path.expanduser(str(path)))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(field, f"'{path}' is not a tokenizer.json the tokenizers package loads: {first}") from None


def utf8_text(data: bytes, path: Path, *, field: str = "INPUT") -> str:
    """``data`` (the bytes of ``path``) as text; :class:`ConfigError` where it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.start:,}): {exc.reason}") from None


def _python_source(path: Path) -> str:
    """A Python file's text: UTF-8, else decoded by its coding declaration (PEP 263), else as
    Latin-1 (the standard library's tests hold modules with deliberately broken declarations;
    every byte is a Latin-1 character)."""
    import io
    import tokenize as python_tokenize

    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        encoding, _ = python_tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("latin-1")


def threads(n: int) -> None:
    """Encode with ``n`` threads of ``tokenizers``' own pool (its Rust thread pool parallelises a
    batch over its documents; 1: single-threaded). The pool's size is fixed when a process first
    uses it: ``RAYON_NUM_THREADS``, set to ``n`` here unless already set."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(n))
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if n > 1 else "false"


def encode(tokenizer: Any, texts: list[str], specials: Specials) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: the documents ``texts`` encoded (no post-processing), each with
    ``bos_id`` before it (where set) and ``eos_id`` after, concatenated in ``specials.dtype``,
    and each document's length."""
    import itertools

    import numpy as np

    encoded = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    head = () if specials.bos_id is None else (specials.bos_id,)
    tail = (specials.eos_id,)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + len(head) + 1
    flat = itertools.chain.from_iterable(itertools.chain(head, ids, tail) for ids in encoded)
    ids = np.fromiter(flat, dtype=specials.dtype, count=int(lengths.sum()))
    return ids, lengths


def tokenize_to_file(
    files: list[Path], tokenizer_path: str | Path, specials: Specials, out: Path, *, python_source: bool = False
) -> int:
    """Write the tokens of ``files`` (each one UTF-8 document, as ``data=text`` reads them; with
    ``python_source``, Python files decoded as Python does, by their coding declaration: the
    ``stdlib`` corpus has a few Latin-1 and KOI8-R test modules) to the raw token file ``out``,
    atomically; returns the tokens written. What ``data=text|stdlib data.tokenizer.path=...`` caches."""
    tokenizer = load_tokenizer(tokenizer_path, field="data.tokenizer.path")
    from olmx.writable import atomic_file

    total = 0
    with atomic_file(out) as f:
        texts: list[str] = []
        chars = 0
        for i, path in enumerate(files):
            text = _python_source(path) if python_source else utf8_text(path.read_bytes(), path, field="data.paths")
            texts.append(text)
            chars += len(texts[-1])
            if chars >= BATCH_CHARS or i == len(files) - 1:
                ids, _ = encode(tokenizer, texts, specials)
                f.write(ids.tobytes())
                total += int(ids.size)
                texts, chars = [], 0
    return total
