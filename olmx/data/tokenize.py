"""``olmx data tokenize INPUT... --tokenizer PATH --out DIR``: text to OLMo-core token files.

Inputs are files, folders (every file below them, recursively, in name order; hidden names
skipped) and globs. A ``.jsonl``, ``.jsonl.gz``, ``.json.gz`` or ``.ndjson`` file holds one
document per line, in its ``text`` field; any other file is one UTF-8 document (``.gz``:
gzipped). Documents are encoded with a Hugging Face ``tokenizer.json`` by
:mod:`olmx.data.encode` (the ``tokenizers`` package, the ``tokenize`` extra, imported only
there), as ``data=text`` with ``data.tokenizer.path`` encodes them: no post-processing, the
beginning-of-document id before each document where the tokenizer adds one, the
end-of-document id after each (:mod:`olmx.data.tokenizer` finds both, as the plan does).
``--workers N`` threads of ``tokenizers``' own pool encode the documents of each batch (about
1 Mi characters) in parallel, in this process, which reads and writes in order: on the build
machine this was faster than as many encoder processes, which pay for start-up and for sending
text and ids between processes (``benchmarks/tokenize.py``).

The output is OLMo-core's raw token arrays (no header; ids in the dtype OLMo-core reads for the
vocabulary, :func:`olmx.data.files.token_dtype`), named ``part-00000.npy``, ... as OLMo-core's
own data: shards of whole documents, each closed once it holds ``--shard-tokens`` ids, written
under a hidden temporary name and renamed when complete. ``DIR/olmx-tokenized.json`` records
the tokenizer (SHA-256, vocabulary, special ids) and, per input, its path, size, modification
time, documents, tokens and shards; it is rewritten (atomically) after every shard.

Rerunning skips the inputs already done (same path, size and modification time; a changed one
is refused) and continues a partly written input after its last document in a complete shard,
so an interrupted run, rerun, writes the files an uninterrupted one would have. A folder of
another tokenizer is refused; files olmx did not write are never overwritten (a name it needs
that exists and is not in the metadata is refused).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from olmx.data import encode as encoding
from olmx.data.encode import Specials, encode, load_tokenizer, threads, utf8_text
from olmx.errors import ConfigError
from olmx.writable import TEMPORARY_SUFFIX, check_writable, temporary, write_text_atomic

if TYPE_CHECKING:
    import numpy as np

    from olmx.config.schema import RunConfig

#: The metadata file in an output folder.
METADATA = "olmx-tokenized.json"
#: Version of the metadata's layout.
FORMAT = 1
#: Input names read as JSON Lines (one document per line, in its ``text`` field).
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".ndjson", ".ndjson.gz")
#: Default ids per shard (256 Mi: 512 MiB of uint16), as the size of OLMo's own token files.
DEFAULT_SHARD_TOKENS = 1 << 28


@dataclass(frozen=True)
class Summary:
    """What one ``olmx data tokenize`` did."""

    #: The output folder.
    out: Path
    #: Documents and tokens written by this run.
    documents: int
    tokens: int
    #: Seconds it took (reading, encoding, writing).
    seconds: float
    #: Shards written by this run.
    shards: list[str]
    #: Inputs tokenized by this run, and inputs skipped as already done.
    inputs: int
    skipped: int
    #: The folder's totals, over every run into it.
    total_documents: int
    total_tokens: int

    @property
    def tokens_per_s(self) -> float:
        """This run's throughput."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def specials_of(path: str | Path, *, eos_id: int | None = None, field: str = "--tokenizer") -> Specials:
    """The ids of the tokenizer at ``path`` (:func:`olmx.data.tokenizer.read_tokenizer_json`);
    ``eos_id`` is needed where the tokenizer names no end-of-document token, and must agree
    where it does."""
    from olmx.data.tokenizer import read_tokenizer_json

    facts = read_tokenizer_json(path, field=field)
    eos = facts.eos_id
    if eos is None:
        if eos_id is None:
            raise ConfigError(
                "--eos-id",
                f"the tokenizer {path} names no end-of-document token: give the id that ends each document",
            )
        eos = eos_id
    elif eos_id is not None and eos_id != eos:
        raise ConfigError("--eos-id", f"{eos_id} conflicts with the tokenizer's {facts.describe('eos_id', eos)}")
    if not 0 <= eos < facts.vocab_size:
        raise ConfigError("--eos-id", f"{eos} is outside the tokenizer's ids [0, {facts.vocab_size})")
    pad = facts.pad_id if facts.pad_id is not None else eos
    from olmx.data.files import token_dtype

    vocab = facts.vocab_size
    return Specials(vocab_size=vocab, eos_id=eos, pad_id=pad, bos_id=facts.bos_id, dtype=token_dtype(vocab))


def input_files(inputs: list[str], *, exclude: Path | None = None) -> list[Path]:
    """The files ``inputs`` name, in order (each folder's files and each glob's matches sorted;
    a file named twice counts once; files under ``exclude``, the output folder, are left out)."""
    import glob

    out: dict[str, Path] = {}
    skip = os.path.abspath(exclude) + os.sep if exclude is not None else None

    def add(path: Path) -> None:
        key = os.path.abspath(path)
        if skip is None or not key.startswith(skip):
            out.setdefault(key, Path(key))

    for given in inputs:
        expanded = os.path.expanduser(given)
        if glob.has_magic(expanded):
            matches = sorted(glob.glob(expanded, recursive=True))
            if not matches:
                raise ConfigError("INPUT", f"'{given}' matches no file")
        elif os.path.exists(expanded):
            matches = [expanded]
        else:
            raise ConfigError("INPUT", f"'{given}' does not exist")
        for m in matches:
            if os.path.isdir(m):
                for root, dirs, files in os.walk(m):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for name in sorted(files):
                        if not name.startswith("."):
                            add(Path(root) / name)
            elif os.path.isfile(m):
                add(Path(m))
            else:
                raise ConfigError("INPUT", f"'{m}' is not a regular file")
    for path in out.values():
        if not os.access(path, os.R_OK):
            raise ConfigError("INPUT", f"'{path}' is not readable")
    return list(out.values())


def documents(path: Path, *, lines: bool | None = None) -> Iterator[tuple[str, int]]:
    """``(text, bytes of the file read so far)`` of each document of ``path`` (see the module
    docstring; ``lines`` forces JSON Lines on or off). Raises :class:`ConfigError` naming the
    file (and line) for text that is not UTF-8, a line that is not JSON or has no ``text``."""
    name = path.name.lower()
    jsonl = name.endswith(JSONL_SUFFIXES) if lines is None else lines
    with open(path, "rb") as raw:
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw  # type: ignore[assignment]
        try:
            if not jsonl:
                data = stream.read()
                yield utf8_text(data, path), raw.tell()
                return
            for n, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise ConfigError("INPUT", f"{path}:{n} is not a JSON line ({exc})") from None
                text = obj.get("text") if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
                    raise ConfigError("INPUT", f'{path}:{n} has no "text" string field (it has: {keys or "nothing"})')
                yield text, raw.tell()
        except (gzip.BadGzipFile, EOFError, OSError) as exc:
            raise ConfigError("INPUT", f"{path} cannot be read: {exc}") from None


#: One batch for the encoders: ``(input index, finishes the input, bytes read, texts)``.
_Batch = tuple[int, bool, int, list[str]]


def _batches(files: list[Path], skip: dict[int, int]) -> Iterator[_Batch]:
    """Batches of about :data:`olmx.data.encode.BATCH_CHARS` characters, never across
    inputs; the last batch of each input says so (and may be empty). ``skip``: documents to leave out at the start of an
    input (those already in complete shards)."""
    for index, path in enumerate(files):
        texts: list[str] = []
        chars, done, read = 0, 0, 0
        for text, read in documents(path):
            if done < skip.get(index, 0):
                done += 1
                continue
            texts.append(text)
            chars += len(text)
            if chars >= encoding.BATCH_CHARS:
                yield index, False, read, texts
                texts, chars = [], 0
        yield index, True, read, texts


class _Writer:
    """Shards of whole documents and the metadata that records them (see the module docstring)."""

    def __init__(self, out: Path, meta: dict[str, Any], records: list[dict[str, Any]], shard_tokens: int) -> None:
        self.out, self.meta, self.records, self.shard_tokens = out, meta, records, shard_tokens
        self.file: IO[bytes] | None = None
        self.tmp: Path | None = None
        self.tokens = 0
        self.pending: dict[int, list[int]] = {}  # input index -> [documents, tokens] in the open shard
        self.finished: set[int] = set()
        self.written: list[str] = []

    def name(self) -> str:
        return f"part-{len(self.meta['shards']):05d}.npy"

    def add(self, index: int, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append the documents of input ``index``; close the shard where it reaches its size."""
        import numpy as np

        start = 0
        ends = np.cumsum(lengths)
        first = 0
        while first < len(lengths):
            # The first document after which the open shard holds at least shard_tokens ids.
            room = self.shard_tokens - self.tokens
            last = int(np.searchsorted(ends - start, room, side="left"))
            last = min(last, len(lengths) - 1)
            stop = int(ends[last])
            self._write(index, ids[start:stop], last + 1 - first)
            first, start = last + 1, stop
            if self.tokens >= self.shard_tokens:
                self.commit()

    def _write(self, index: int, ids: np.ndarray, docs: int) -> None:
        if self.file is None:
            name = self.name()
            target = self.out / name
            if target.exists() or target.is_symlink():
                raise ConfigError(
                    "--out",
                    f"{target} exists and olmx did not write it (not in {METADATA}); tokenize into another folder",
                )
            self.tmp = temporary(self.out / f".{name}")
            self.file = open(self.tmp, "wb")
        self.file.write(ids.tobytes())
        self.tokens += int(ids.size)
        counts = self.pending.setdefault(index, [0, 0])
        counts[0] += docs
        counts[1] += int(ids.size)

    def finish_input(self, index: int) -> None:
        """Input ``index`` is read to its end: done once its documents are in complete shards."""
        self.finished.add(index)
        if index not in self.pending:
            self.records[index]["done"] = True

    def commit(self) -> None:
        """Close the open shard, claim it in the metadata (``pending``), rename it into place,
        and record it there. A kill between the claim and the record leaves a shard the next run
        knows is olmx's (:func:`drop_pending`), never one it must refuse as someone else's."""
        if self.file is not None and self.tmp is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            name = self.name()
            self.meta["pending"] = name
            write_metadata(self.out, self.meta)
            self.tmp.replace(self.out / name)
            self.file = self.tmp = None
            del self.meta["pending"]
            docs = sum(d for d, _ in self.pending.values())
            self.meta["shards"].append({"name": name, "documents": docs, "tokens": self.tokens})
            self.written.append(name)
            for index, (d, t) in self.pending.items():
                rec = self.records[index]
                rec["documents"] += d
                rec["tokens"] += t
                rec["shards"].append(name)
            for index in self.finished:
                self.records[index]["done"] = True
            self.pending, self.tokens = {}, 0
        write_metadata(self.out, self.meta)

    def abort(self) -> None:
        """Drop the open shard (an interrupted run: its documents are tokenized again next time)."""
        if self.file is not None:
            self.file.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def read_metadata(folder: Path) -> dict[str, Any] | None:
    """``folder``'s :data:`METADATA` (None where there is none). Raises :class:`ConfigError`
    for a file of that name that olmx cannot have written."""
    path = folder / METADATA
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError("--out", f"{path} is unreadable ({exc}); olmx data tokenize did not write it") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError("--out", f"{path} is not olmx data tokenize's metadata (format {FORMAT})")
    return meta


#: The temporary files a run writes in its folder (an open shard, the metadata being replaced):
#: named by olmx alone, with the writer's process id.
_TEMPORARY = re.compile(rf"(\.part-\d+\.npy|{re.escape(METADATA)}){TEMPORARY_SUFFIX}")


def drop_pending(folder: Path, meta: dict[str, Any]) -> None:
    """What a killed run left (this run holds the folder's lock, so no writer is alive): a shard
    it claimed (``pending``) but did not record (its documents were not recorded either, so this
    run tokenizes them again), and its temporary files."""
    for path in folder.iterdir():
        if _TEMPORARY.fullmatch(path.name):
            path.unlink(missing_ok=True)
    name = meta.pop("pending", None)
    if name:
        (folder / name).unlink(missing_ok=True)
        write_metadata(folder, meta)


def lock_path(folder: Path) -> Path:
    """The lock one ``olmx data tokenize`` holds on ``folder``: in the temporary directory, not
    in the user's folder, where it would be left behind."""
    import hashlib
    import tempfile

    key = hashlib.sha256(str(folder.absolute()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"olmx-tokenize-{key}.lock"


def write_metadata(folder: Path, meta: dict[str, Any]) -> None:
    """Write :data:`METADATA` whole or not at all."""
    write_text_atomic(folder / METADATA, json.dumps(meta, indent=1) + "\n")


def tokenize(
    inputs: list[str],
    tokenizer_path: str | Path,
    out: str | Path,
    *,
    workers: int = 1,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    eos_id: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Summary:
    """Tokenize ``inputs`` into ``out`` (see the module docstring). ``progress(done, total)`` is
    called with the input bytes read so far; ``workers``: encoding threads (:func:`threads`)."""
    from olmx.data.tokenizer import read_tokenizer_json

    if workers < 1:
        raise ConfigError("--workers", f"must be at least 1, got {workers}")
    if shard_tokens < 1:
        raise ConfigError("--shard-tokens", f"must be at least 1, got {shard_tokens}")
    folder = Path(os.path.expanduser(str(out))).absolute()
    check_writable(folder, "--out", hint="the token files are written there")
    specials = specials_of(tokenizer_path, eos_id=eos_id)
    sha = read_tokenizer_json(tokenizer_path, field="--tokenizer").sha256
    files = input_files(inputs, exclude=folder)
    tokenizer = load_tokenizer(tokenizer_path)  # refused here, before anything is written
    from filelock import FileLock

    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(lock_path(folder))):
            meta = read_metadata(folder) or {
                "format": FORMAT,
                "tokenizer": {
                    "path": str(Path(os.path.expanduser(str(tokenizer_path))).absolute()),
                    "sha256": sha,
                    "vocab_size": specials.vocab_size,
                    "eos_id": specials.eos_id,
                    "pad_id": specials.pad_id,
                    "bos_id": specials.bos_id,
                },
                "dtype": specials.dtype,
                "inputs": [],
                "shards": [],
            }
            check_same_tokenizer(
                meta["tokenizer"],
                str(folder),
                sha256=sha,
                path=str(tokenizer_path),
                ids={"eos_id": specials.eos_id, "bos_id": specials.bos_id},
                fields={"sha256": "--tokenizer", "eos_id": "--eos-id", "bos_id": "--tokenizer"},
                then="one folder holds one tokenizer's ids, tokenize into another --out",
            )
            drop_pending(folder, meta)
            records, skip, todo = _plan_inputs(meta, files)
            job = _Job(folder, meta, files, records, skip, todo, tokenizer, str(tokenizer_path), specials)
            return _run(job, workers=workers, shard_tokens=shard_tokens, progress=progress)
    except BaseException:
        if created and not (folder / METADATA).exists():  # failed before its first shard: leave nothing
            folder.rmdir()
        raise


@dataclass(frozen=True)
class _Job:
    """One run's inputs and state, for :func:`_run`."""

    folder: Path
    meta: dict[str, Any]
    files: list[Path]
    records: list[dict[str, Any]]
    skip: dict[int, int]
    todo: list[int]
    tokenizer: Any
    tokenizer_path: str
    specials: Specials


def check_same_tokenizer(
    had: dict[str, Any],
    where: str,
    *,
    sha256: str | None,
    path: str,
    ids: Mapping[str, int | None],
    fields: Mapping[str, str],
    then: str,
) -> None:
    """Refuse a tokenizer other than the one that wrote a folder's token files (``had``: the
    ``tokenizer`` record of its :data:`METADATA`; ``where``: the folder or file, for the message):
    another file (``sha256``, of ``path``; None where there is none to compare) or other end- or
    beginning-of-document ids (``ids``). ``fields`` names what each of ``sha256``, ``eos_id`` and
    ``bos_id`` is blamed on (an option of ``olmx data tokenize``, a field of the plan); ``then``
    says what to do. The one check that ``olmx data tokenize`` (continuing a folder) and the plan
    (training on its files) make."""
    if sha256 is not None and had["sha256"] != sha256:
        raise ConfigError(
            fields["sha256"],
            f"{where} holds the ids of another tokenizer, {had['path']} (sha256 {had['sha256'][:12]}), not {path} "
            f"(sha256 {sha256[:12]}): {then}",
        )
    for key in ("eos_id", "bos_id"):
        if had[key] != ids[key]:
            raise ConfigError(
                fields[key], f"{where} holds ids of {had['path']}, whose {key} is {had[key]}, not {ids[key]}: {then}"
            )


def _plan_inputs(meta: dict[str, Any], files: list[Path]) -> tuple[list[dict[str, Any]], dict[int, int], list[int]]:
    """Per file its metadata record (new ones appended to ``meta``), the documents to skip at
    the start of partly done files, and the indices of the files still to tokenize."""
    known = {rec["path"]: rec for rec in meta["inputs"]}
    records, skip, todo = [], {}, []
    for index, path in enumerate(files):
        st = path.stat()
        rec = known.get(str(path))
        if rec is None:
            rec = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            rec.update(documents=0, tokens=0, shards=[], done=False)
            meta["inputs"].append(rec)
        elif (rec["size"], rec["mtime_ns"]) != (st.st_size, st.st_mtime_ns):
            raise ConfigError(
                "INPUT",
                f"{path} changed since it was tokenized into this folder (size {rec['size']:,} -> {st.st_size:,} "
                "bytes, or its modification time): tokenize it into another --out",
            )
        records.append(rec)
        if not rec["done"]:
            todo.append(index)
            skip[index] = rec["documents"]
    return records, skip, todo


def _run(job: _Job, *, workers: int, shard_tokens: int, progress: Callable[[int, int], None] | None) -> Summary:
    folder, meta, files, records, skip, todo = job.folder, job.meta, job.files, job.records, job.skip, job.todo
    before_docs = sum(r["documents"] for r in meta["inputs"])
    before_tokens = sum(r["tokens"] for r in meta["inputs"])
    writer = _Writer(folder, meta, records, shard_tokens)
    sizes = [files[i].stat().st_size for i in todo]
    total, base, offsets = sum(sizes), 0, {}
    for i, size in zip(todo, sizes, strict=True):
        offsets[i], base = base, base + size
    chosen = [files[i] for i in todo]
    renumber = dict(enumerate(todo))
    skip_local = {k: skip[i] for k, i in renumber.items()}
    start = time.perf_counter()

    def take(tag: tuple[int, bool, int], ids: np.ndarray, lengths: np.ndarray) -> None:
        index, last, read = tag
        real = renumber[index]
        if len(lengths):
            writer.add(real, ids, lengths)
        if last:
            writer.finish_input(real)
        if progress is not None:
            progress(offsets[real] + read, total)

    threads(workers)
    try:
        for index, last, read, texts in _batches(chosen, skip_local):
            take((index, last, read), *encode(job.tokenizer, texts, job.specials))
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    seconds = time.perf_counter() - start
    docs = sum(r["documents"] for r in meta["inputs"])
    tokens = sum(r["tokens"] for r in meta["inputs"])
    return Summary(
        out=folder,
        documents=docs - before_docs,
        tokens=tokens - before_tokens,
        seconds=seconds,
        shards=writer.written,
        inputs=len(todo),
        skipped=len(files) - len(todo),
        total_documents=docs,
        total_tokens=tokens,
    )


def tokenized_file_rows(run: RunConfig, files: list[Path]) -> list[tuple[str, str]]:
    """Check the ``data=numpy`` files that ``olmx data tokenize`` wrote (listed in the
    :data:`METADATA` beside them), at plan time, against the run's tokenizer: the same file
    (SHA-256) where ``data.tokenizer.path`` is set, the same special ids and the dtype OLMo-core
    reads them in. Returns the plan's rows about the tokenizer and those files."""
    from olmx.data.files import token_dtype
    from olmx.data.tokenizer import read_tokenizer_json, tokenizer_rows

    tok = run.data.tokenizer
    facts = read_tokenizer_json(tok.path) if tok.path else None
    folders: dict[Path, dict[str, Any] | None] = {}
    listed: dict[Path, int] = {}
    for path in files:
        folder = path.parent.absolute()
        if folder not in folders:
            try:
                folders[folder] = read_metadata(folder)
            except ConfigError as exc:
                raise ConfigError("data.paths", str(exc).removeprefix(f"{exc.field}: ")) from None
        meta = folders[folder]
        if meta is None or path.name not in {s["name"] for s in meta["shards"]}:
            continue
        listed[folder] = listed.get(folder, 0) + 1
        had = meta["tokenizer"]
        where = f"'{path}' was written by olmx data tokenize with the tokenizer {had['path']} ({folder / METADATA})"
        hint = "" if tok.path else f"; set data.tokenizer.path={had['path']}"
        check_same_tokenizer(
            had,
            f"'{path}' ({folder / METADATA})",
            sha256=facts.sha256 if facts is not None else None,
            path=str(tok.path),
            ids={"eos_id": tok.eos_id, "bos_id": tok.bos_id},
            fields={
                "sha256": "data.tokenizer.path",
                "eos_id": "data.tokenizer.eos_id",
                "bos_id": "data.tokenizer.bos_id",
            },
            then=f"train with the tokenizer that made the files{hint}",
        )
        if had["vocab_size"] > tok.vocab_size or meta["dtype"] != token_dtype(tok.vocab_size):
            raise ConfigError(
                "data.tokenizer.vocab_size",
                f"{where}: {had['vocab_size']:,} ids stored as {meta['dtype']}; data.tokenizer.vocab_size="
                f"{tok.vocab_size:,} reads {token_dtype(tok.vocab_size)}{hint}",
            )
    rows = tokenizer_rows(run)
    for folder, n in listed.items():
        meta = folders[folder]
        assert meta is not None
        docs = sum(r["documents"] for r in meta["inputs"])
        rows.append(("tokenized", f"{n} of the files from olmx data tokenize in {folder} ({docs:,} documents)"))
    return rows
