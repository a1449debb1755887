"""Training tokens: the embedded stdlib corpus, the user's text files, or OLMo-core token files.

``stdlib`` and ``text`` are tokenized byte-level (ids 0-255 are bytes, one end-of-document id
after each file) into a raw ``uint16`` token array, the format OLMo-core's numpy datasets
read (no header). The array is written once into the cache directory under a name derived
from the files' paths, sizes and modification times, and reused; a file lock makes
concurrent ranks wait for the first writer instead of racing it. With ``data.tokenizer.path``
they are encoded with that Hugging Face tokenizer instead (:mod:`olmx.data.encode`, as
``olmx data tokenize`` encodes), into a cache in the vocabulary's dtype whose name also derives
from the tokenizer file's SHA-256 and special ids (:func:`text_cache_file`).

``numpy`` files are OLMo-core's raw token arrays: no header, ids in the dtype OLMo-core chooses
from the vocabulary (:func:`token_dtype`: the smallest unsigned type that holds every id).
OLMo-core's ``NumpyFSLDataset`` reads them as memory maps from byte 0, so a ``.npy`` written
by ``np.save`` (a header, then ids of any integer dtype, any C-ordered shape) would have its
header read as tokens and, for a wider dtype than OLMo-core's, every id split into several.
Such a file is read through its header (``np.load(mmap_mode="r")`` semantics) and copied once,
raw and in OLMo-core's dtype, into the cache (:func:`raw_copy`), every id checked against
the vocabulary on the way; raw files are used as they are.

The plan checks token files cheaply (:func:`inspect_token_file`: the header or the size, and
a sample of ids), before anything is launched; nothing here imports torch or OLMo-core, and
numpy is imported only by the functions that read ids.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmx.config.schema import DataConfig
from olmx.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

#: Directory names under the stdlib that hold third-party code, not the standard library.
_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}

#: The unsigned dtypes OLMo-core 3.0.0 reads token files in, smallest first, with their bits
#: (``NumpyDatasetConfig.get_dtype``: the first that holds ``vocab_size - 1``).
TOKEN_DTYPES = (("uint8", 8), ("uint16", 16), ("uint32", 32), ("uint64", 64))

#: Ids read per sampled window of a token file at plan time, and the windows per file
#: (spread evenly, the first and the last included): at most 64 Ki ids per file.
SAMPLE_WINDOW = 4096
SAMPLE_WINDOWS = 16

#: Ids converted per chunk when an ``np.save``'d file is copied raw into the cache.
COPY_CHUNK = 1 << 22

#: The magic string every ``.npy`` file starts with.
NPY_MAGIC = b"\x93NUMPY"


def cache_dir(data: DataConfig) -> Path:
    """Where tokenized caches live: ``data.cache_dir``, else ``$OLMX_CACHE_DIR``, else
    ``~/.cache/olmx`` (an empty ``$OLMX_CACHE_DIR`` counts as unset)."""
    if data.cache_dir:
        return Path(data.cache_dir).expanduser()
    return Path(os.environ.get("OLMX_CACHE_DIR") or Path.home() / ".cache" / "olmx").expanduser()


def cache_field(data: DataConfig) -> str:
    """The setting that chose :func:`cache_dir` (what an error about the cache names)."""
    if data.cache_dir or not os.environ.get("OLMX_CACHE_DIR"):
        return "data.cache_dir"
    return "OLMX_CACHE_DIR"


def check_cache_dir(data: DataConfig) -> Path:
    """The cache directory, checked by :func:`olmx.writable.check_writable` (it, or the nearest
    parent that exists, takes a new directory and file, removed at once; the cache itself is
    untouched). Raises :class:`ConfigError` naming ``data.cache_dir`` or ``OLMX_CACHE_DIR``."""
    from olmx.writable import check_writable

    root = cache_dir(data).absolute()
    hint = "tokenized caches are written there; choose another with data.cache_dir=DIR or $OLMX_CACHE_DIR"
    check_writable(root, cache_field(data), hint=hint)
    return root


def stdlib_files() -> list[Path]:
    """The ``.py`` files of the running Python's standard library, in a stable order (walked
    once per process: the plan asks three times)."""
    return list(_stdlib_files())


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> tuple[Path, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_STDLIB)
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return tuple(files)


def text_files(paths: list[str]) -> list[Path]:
    """The files ``paths`` name (globs expanded; each pattern's matches sorted, in the given order)."""
    out: list[Path] = []
    for p in paths:
        out += [Path(m) for m in sorted(glob.glob(os.path.expanduser(p)))]
    return out


def corpus_files(paths: list[str], *, example: str = "*") -> list[Path]:
    """:func:`text_files`, checked: every pattern matches something, and every match is a
    readable regular file (a directory is refused by name, with the glob that names its
    files: ``example`` is the file pattern suggested)."""
    out: list[Path] = []
    for p in paths:
        matches = sorted(glob.glob(os.path.expanduser(p)))
        if not matches:
            raise ConfigError("data.paths", f"'{p}' does not exist")
        for m in matches:
            if os.path.isdir(m):
                raise ConfigError(
                    "data.paths",
                    f"'{m}' is a directory; name its files, e.g. data.paths=[{m.rstrip(os.sep)}{os.sep}{example}]",
                )
            if not os.path.isfile(m):
                raise ConfigError("data.paths", f"'{m}' is not a regular file")
            if not os.access(m, os.R_OK):
                raise ConfigError("data.paths", f"'{m}' is not readable")
            out.append(Path(m))
    return out


def byte_corpus_tokens(files: list[Path]) -> int:
    """Tokens of the byte-level cache of ``files``, from their sizes alone: one per byte plus
    one end-of-document id per file (exactly what :func:`tokenize_bytes` writes)."""
    return sum(path.stat().st_size + 1 for path in files)


def token_dtype(vocab_size: int) -> str:
    """The dtype OLMo-core 3.0.0 reads raw token files in for ``vocab_size`` ids: the
    smallest of uint8, uint16, uint32, uint64 that holds ``vocab_size - 1``."""
    for name, bits in TOKEN_DTYPES:
        if vocab_size - 1 < 1 << bits:
            return name
    raise ConfigError("data.tokenizer.vocab_size", f"{vocab_size} ids do not fit in 64 bits")


@dataclass(frozen=True)
class NpyHeader:
    """The header of an ``np.save``'d file: what ``np.load(mmap_mode="r")`` reads."""

    #: The array's shape.
    shape: tuple[int, ...]
    #: Column-major layout (``np.save`` of a Fortran-ordered array).
    fortran: bool
    #: The ids' dtype, byte order included (``<i8``).
    dtype: str
    #: Bytes before the first id.
    offset: int

    @property
    def items(self) -> int:
        """Ids in the array."""
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def npy_header(path: Path) -> NpyHeader | None:
    """The ``.npy`` header of ``path``, or None for a raw token file (no ``.npy`` magic).
    Raises :class:`ConfigError` for a file that starts like a ``.npy`` but whose header
    cannot be read."""
    with open(path, "rb") as f:
        if f.read(len(NPY_MAGIC)) != NPY_MAGIC:
            return None
        import numpy as np

        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
        except ValueError as exc:
            raise ConfigError(
                "data.paths", f"'{path}' starts like a .npy file but its header is unreadable: {exc}"
            ) from None
        return NpyHeader(shape=tuple(shape), fortran=bool(fortran), dtype=dtype.str, offset=f.tell())


@dataclass(frozen=True)
class TokenFile:
    """One ``data=numpy`` file as the plan sees it (its header or its size, and a sample)."""

    #: The file.
    path: str
    #: Token ids it holds.
    tokens: int
    #: The ids' dtype on disk (a raw file: OLMo-core's dtype for the vocabulary).
    dtype: str
    #: An ``np.save``'d ``.npy``: read through its header and copied raw into the cache.
    header: bool


def inspect_token_file(path: Path, vocab_size: int) -> TokenFile:
    """Check one ``data=numpy`` file cheaply (header or size, and a sample of ids): a raw file
    holds a whole number of OLMo-core's ids and does not look like wider integers written raw;
    an ``np.save``'d file holds integers in C order and is complete; the sampled ids are in
    ``[0, vocab_size)``. Raises :class:`ConfigError` naming ``data.paths`` and the file."""
    import numpy as np

    target = np.dtype(token_dtype(vocab_size))
    header = npy_header(path)
    size = path.stat().st_size
    if header is None:
        if size % target.itemsize:
            raise ConfigError(
                "data.paths",
                f"'{path}' has {size:,} bytes, not a whole number of {target.name} token ids "
                f"({target.itemsize} bytes each: OLMo-core reads raw token files as {target.name} for "
                f"data.tokenizer.vocab_size={vocab_size}); write them with "
                f"tokens.astype(np.{target.name}).tofile(path) or np.save(path, tokens)",
            )
        n = size // target.itemsize
        ids = np.memmap(path, dtype=target, mode="r") if n else np.empty(0, target)
        windows = _sample(ids)
        _check_not_wide(path, windows, target)
        dtype = target
    else:
        dtype = np.dtype(header.dtype)
        if dtype.kind not in "iu":
            raise ConfigError(
                "data.paths",
                f"'{path}' holds {dtype.name} values, not integer token ids "
                f"(np.save(path, tokens.astype(np.{target.name})) with integer ids)",
            )
        if header.fortran and len(header.shape) > 1:
            raise ConfigError(
                "data.paths",
                f"'{path}' is a Fortran-ordered {len(header.shape)}-D array; save it in C order: "
                "np.save(path, np.ascontiguousarray(tokens))",
            )
        n = header.items
        if header.offset + n * dtype.itemsize > size:
            raise ConfigError(
                "data.paths",
                f"'{path}' is truncated: its header announces {n:,} {dtype.name} ids "
                f"({header.offset + n * dtype.itemsize:,} bytes), the file has {size:,} bytes",
            )
        ids = np.memmap(path, dtype=dtype, mode="r", offset=header.offset, shape=(n,)) if n else np.empty(0, dtype)
        windows = _sample(ids)
    raw = f"; OLMo-core reads raw token files as {target.name} for this vocabulary" if header is None else ""
    for start, window in windows:
        _check_ids(path, start, window, vocab_size, sampled=True, hint=raw)
    return TokenFile(path=str(path), tokens=n, dtype=dtype.name, header=header is not None)


def _sample(ids: Any) -> list[tuple[int, np.ndarray]]:
    """``(start, ids)`` windows spread over a 1-D array (all of it when it is small); starts
    are multiples of 8 so that wider integers written raw line up (:func:`_check_not_wide`)."""
    import numpy as np

    n = len(ids)
    if n <= SAMPLE_WINDOW * SAMPLE_WINDOWS:
        return [(0, np.asarray(ids))]
    starts = sorted({int(s) // 8 * 8 for s in np.linspace(0, n - SAMPLE_WINDOW, SAMPLE_WINDOWS)})
    return [(s, np.asarray(ids[s : s + SAMPLE_WINDOW])) for s in starts]


def _check_not_wide(path: Path, windows: list[tuple[int, np.ndarray]], target: np.dtype) -> None:
    """Refuse a raw file that looks like wider little-endian integers (int32/int64 ids written
    with ``tofile``): in every sampled group of ``k`` ids only the first is ever non-zero. Read
    as OLMo-core's narrower dtype, that trains on the ids interleaved with zeros."""
    import numpy as np

    for bits in (64, 32, 16):
        k = bits // (8 * target.itemsize)
        if k < 2:
            continue
        groups = [w[: len(w) // k * k].reshape(-1, k) for _, w in windows]
        rows = np.concatenate(groups) if groups else np.empty((0, k), target)
        if len(rows) >= 16 and rows[:, 0].any() and not rows[:, 1:].any():
            raise ConfigError(
                "data.paths",
                f"'{path}' looks like {bits}-bit integers written raw (of every {k} {target.name} ids read, "
                f"only the first is ever non-zero); OLMo-core reads raw token files as {target.name} here: "
                f"write them with tokens.astype(np.{target.name}).tofile(path), or np.save(path, tokens)",
            )


def _check_ids(path: Path, start: int, ids: np.ndarray, vocab_size: int, *, sampled: bool, hint: str = "") -> None:
    """Every id of ``ids`` (``path``'s ids from ``start``) is in ``[0, vocab_size)``."""
    if not ids.size:
        return
    bad = (ids >= vocab_size) | (ids < 0) if ids.dtype.kind == "i" else ids >= vocab_size
    if bad.any():
        at = int(bad.argmax())
        raise ConfigError(
            "data.paths",
            f"'{path}' holds token id {int(ids[at])} at position {start + at:,}"
            f"{' (in a sample of its ids)' if sampled else ''}, outside the vocabulary "
            f"[0, data.tokenizer.vocab_size={vocab_size}){hint}",
        )


def tokenize_bytes(files: list[Path], eos_id: int, out: Path) -> int:
    """Write the byte-level tokens of ``files`` (each followed by ``eos_id``) to ``out``."""
    import numpy as np

    from olmx.writable import atomic_file

    total = 0
    with atomic_file(out) as f:
        for path in files:
            raw = path.read_bytes()
            tokens = np.empty(len(raw) + 1, dtype=np.uint16)
            tokens[:-1] = np.frombuffer(raw, dtype=np.uint8)
            tokens[-1] = eos_id
            f.write(tokens.tobytes())
            total += tokens.size
    return total


def raw_copy(path: Path, header: NpyHeader, data: DataConfig) -> Path:
    """The raw token array OLMo-core reads for the ``np.save``'d ``path``: its ids in
    :func:`token_dtype`, no header, in the cache under a name derived from the file's path,
    size and modification time; written once (a file lock makes concurrent ranks wait for
    the first writer), every id checked against the vocabulary."""
    import numpy as np
    from filelock import FileLock

    from olmx.writable import atomic_file

    vocab = data.tokenizer.vocab_size
    target = np.dtype(token_dtype(vocab))
    st = path.stat()
    key = hashlib.sha256(f"{path.absolute()}|{st.st_size}|{st.st_mtime_ns}|{target.str}|v1".encode())
    root = cache_dir(data)
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"npy-{path.stem}-{key.hexdigest()[:16]}.{target.name}"
    with FileLock(str(out) + ".lock"):
        if out.exists():
            return out
        n = header.items
        dtype = np.dtype(header.dtype)
        ids = np.memmap(path, dtype=dtype, mode="r", offset=header.offset, shape=(n,)) if n else np.empty(0, dtype)
        with atomic_file(out) as f:
            for start in range(0, n, COPY_CHUNK):
                chunk = np.asarray(ids[start : start + COPY_CHUNK])
                _check_ids(path, start, chunk, vocab, sampled=False)
                f.write(chunk.astype(target).tobytes())
    return out


def scanned_raw(path: Path, data: DataConfig) -> Path:
    """The raw token file ``path`` (OLMo-core reads it as it is) once every id in it is known to
    be in the vocabulary: the plan checks a sample of its ids (cheaply, on any machine); the
    worker scans all of them here before the first step, in chunks, once per file: a marker in
    the cache, named from the file's path, size, modification time and the vocabulary, says it
    was scanned (a file lock makes concurrent ranks wait for the first). An id outside the
    vocabulary is one :class:`ConfigError` naming the file and the position, never an index
    error (or a CUDA device-side assert) inside the model."""
    import numpy as np
    from filelock import FileLock

    vocab = data.tokenizer.vocab_size
    target = np.dtype(token_dtype(vocab))
    st = path.stat()
    key = hashlib.sha256(f"{path.absolute()}|{st.st_size}|{st.st_mtime_ns}|{target.str}|{vocab}|v1".encode())
    root = cache_dir(data) / "scanned"
    mark = root / f"{path.stem}-{key.hexdigest()[:16]}"
    if mark.exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(mark) + ".lock"):
        if not mark.exists():
            n = st.st_size // target.itemsize
            ids = np.memmap(path, dtype=target, mode="r", shape=(n,)) if n else np.empty(0, target)
            hint = f"; OLMo-core reads raw token files as {target.name} for this vocabulary"
            for start in range(0, n, COPY_CHUNK):
                _check_ids(path, start, np.asarray(ids[start : start + COPY_CHUNK]), vocab, sampled=False, hint=hint)
            mark.touch()
    return path


def token_files(data: DataConfig) -> list[str]:
    """Paths of the raw token arrays OLMo-core reads for ``data``: caches of ``stdlib``/``text``
    (tokenized byte-level, or with ``data.tokenizer.path``, into the cache first if needed), the raw files of ``numpy``
    as they are and raw copies of its ``np.save``'d files (:func:`raw_copy`). A cache that
    cannot be written (a full disk, a quota) is one :class:`ConfigError` naming the setting that
    chose the cache (:func:`cache_field`), the path and the error; a half-written file is removed."""
    root = cache_dir(data).absolute()
    try:
        return _token_files(data)
    except OSError as exc:
        where = Path(os.path.abspath(exc.filename)) if exc.filename else None
        if where is not None and root not in (where, *where.parents):
            raise  # an input file, not the cache
        raise ConfigError(
            cache_field(data),
            f"cannot write the token cache in '{where or root}': {exc.strerror or exc} "
            "(data.cache_dir=DIR or $OLMX_CACHE_DIR chooses another place)",
        ) from None


def _token_files(data: DataConfig) -> list[str]:
    if data.name == "numpy":
        arrays: list[str] = []
        for path in text_files(data.paths):
            header = npy_header(path)
            arrays.append(str(scanned_raw(path, data) if header is None else raw_copy(path, header, data)))
        return arrays
    files = stdlib_files() if data.name == "stdlib" else text_files(data.paths)
    out = text_cache_file(data, files)
    out.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(out) + ".lock"):
        if not out.exists():
            if data.tokenizer.path:
                tokenize_with_tokenizer(files, data, out)
            else:
                tokenize_bytes(files, data.tokenizer.eos_id, out)
    return [str(out)]


def text_cache_file(data: DataConfig, files: list[Path]) -> Path:
    """The cache file of the tokens of the ``stdlib``/``text`` ``files``: named from their paths,
    sizes and modification times and the tokenizer (byte-level: the end-of-document id; with
    ``data.tokenizer.path``: the tokenizer file's SHA-256 and the special ids), so a change to
    any of them makes a new cache."""
    tok = data.tokenizer
    if tok.path:
        from olmx.data.tokenizer import read_tokenizer_json

        sha = read_tokenizer_json(tok.path).sha256
        key = hashlib.sha256(f"{sha}|{tok.vocab_size}|{tok.eos_id}|{tok.bos_id}|v1".encode())
        label, suffix = f"tok{sha[:8]}", token_dtype(tok.vocab_size)
    else:
        key = hashlib.sha256(f"{sys.version}|{tok.eos_id}".encode())
        label, suffix = "bytes", "u16"
    for path in files:
        st = path.stat()
        key.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return cache_dir(data) / f"{data.name}-{label}-{key.hexdigest()[:16]}.{suffix}.npy"


def tokenize_with_tokenizer(files: list[Path], data: DataConfig, out: Path) -> int:
    """Write the tokens of ``files`` (one document each) encoded with ``data.tokenizer.path``
    (:func:`olmx.data.encode.tokenize_to_file`: the ids ``olmx data tokenize`` writes) to ``out``."""
    from olmx.data.encode import Specials, tokenize_to_file

    tok = data.tokenizer
    assert tok.path
    dtype = token_dtype(tok.vocab_size)
    specials = Specials(vocab_size=tok.vocab_size, eos_id=tok.eos_id, pad_id=tok.pad_id, bos_id=tok.bos_id, dtype=dtype)
    return tokenize_to_file(files, tok.path, specials, out, python_source=data.name == "stdlib")


def tokenizer_corpus_tokens(data: DataConfig, files: list[Path]) -> tuple[int, bool]:
    """``(tokens, exact)`` of the ``stdlib``/``text`` ``files`` with ``data.tokenizer.path``, at
    plan time: exact where their cache exists already (:func:`text_cache_file`), else a bound
    known without tokenizing (one token per byte, plus the end- and beginning-of-document ids:
    a byte-level BPE never makes more). Nothing is tokenized here."""
    import numpy as np

    tok = data.tokenizer
    cache = text_cache_file(data, files)
    if cache.is_file():
        return cache.stat().st_size // np.dtype(token_dtype(tok.vocab_size)).itemsize, True
    if data.name == "text":  # the worker decodes them: not UTF-8 is refused now
        check_text(files)
    return byte_corpus_tokens(files) + (len(files) if tok.bos_id is not None else 0), False


def check_text(files: list[Path]) -> None:
    """:func:`check_utf8` of each file, each version of a file read once per process."""
    for path in files:
        st = path.stat()
        _utf8_once(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _utf8_once(path: str, size: int, mtime_ns: int) -> None:
    """:func:`check_utf8` once per version of a file in this process: the plan counts a text
    corpus's tokens for the corpus, the held-out split, a mixture and the evaluation, and each
    count would read every file again."""
    check_utf8(Path(path))


def check_utf8(path: Path, *, field: str = "data.paths", chunk: int = 1 << 24) -> None:
    """:class:`ConfigError` naming ``path`` and the first offending byte where it is not UTF-8
    text (read in chunks, decoded incrementally: a multi-byte character may span two chunks)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk)
            pending = len(decoder.getstate()[0])  # bytes of a character the last chunk began
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    field,
                    f"{path} is not UTF-8 text (byte {done - pending + exc.start:,}): {exc.reason}; a tokenizer "
                    "reads text, so convert it (iconv -f LATIN1 -t UTF-8) or drop the file",
                ) from None
            if not data:
                return
            done += len(data)
