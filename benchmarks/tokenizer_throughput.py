"""Throughput of ``olmx data tokenize`` against ``tokenizers``' own batch encode, on the same text.

The corpus is the running Python's standard-library ``.py`` files (one document each; the first
``--mb`` MiB of them in olmx's stdlib order), so nothing is downloaded. A byte-level BPE of
``--vocab`` ids is trained once on it with ``tokenizers``. Then, in interleaved rounds, on the
same documents:

* ``olmx data tokenize`` (:func:`olmx.data.tokenize.tokenize`, the whole pipeline: reading the files,
  encoding, EOS per document, writing the shards and the metadata) with ``--workers 1``
  (``tokenizers`` single-threaded) and ``--workers`` = the cores (its thread pool);
* ``tokenizers``' ``Tokenizer.encode_batch`` on the documents already in memory (encoding only),
  single-threaded and with its thread pool, and ``encode_batch_fast`` (no offsets), which olmx uses.

tokens/s per process divides by the threads that encode. (A first design ran ``--workers N``
as N encoder processes of one thread each; it was slower than the thread pool here, see the
record.) Prints a table and writes
``benchmarks/results/tokenize.md``.

    .venv/bin/python benchmarks/tokenizer_throughput.py [--mb 4] [--vocab 8192] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_tokenize import train_bpe  # noqa: E402  (the tests' tokenizer: one recipe for both)


def corpus(mb: float) -> list[Path]:
    """The first ``mb`` MiB of standard-library files that are UTF-8 text."""
    from olmx.data.files import stdlib_files

    out, size = [], 0
    for path in stdlib_files():
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(path)
        size += path.stat().st_size
        if size >= mb * 2**20:
            break
    return out


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=4.0, help="MiB of standard-library text")
    parser.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary size")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians are reported)")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from olmx.data.tokenize import tokenize

    files = corpus(args.mb)
    texts = [p.read_text(encoding="utf-8") for p in files]
    mib = sum(p.stat().st_size for p in files) / 2**20
    cores = len(os.sched_getaffinity(0))
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = Path(tmp) / "tokenizer.json"
        t0 = time.perf_counter()
        train_bpe(texts, args.vocab, tok_path)
        train_s = time.perf_counter() - t0
        tok = Tokenizer.from_file(str(tok_path))
        inputs = [str(p) for p in files]

        def olmx(workers: int):
            def run() -> int:
                out = Path(tempfile.mkdtemp(dir=tmp))
                return tokenize(inputs, tok_path, out, workers=workers).tokens

            return run

        def batch(method: str, threads: bool):
            def run() -> int:
                os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads else "false"
                encoded = getattr(tok, method)(texts, add_special_tokens=False)
                return sum(len(e.ids) for e in encoded) + len(texts)  # + one EOS each, as olmx counts

            return run

        cases = [
            ("olmx data tokenize --workers 1", 1, olmx(1)),
            (f"olmx data tokenize --workers {cores}", cores, olmx(cores)),
            ("tokenizers encode_batch, 1 thread", 1, batch("encode_batch", False)),
            (f"tokenizers encode_batch, threads ({cores})", cores, batch("encode_batch", True)),
            ("tokenizers encode_batch_fast, 1 thread", 1, batch("encode_batch_fast", False)),
            (f"tokenizers encode_batch_fast, threads ({cores})", cores, batch("encode_batch_fast", True)),
        ]
        seconds: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        counts: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, _, fn in cases:
                s, n = timed(fn)
                seconds[name].append(s)
                counts[name] = n
    load_end = os.getloadavg()
    reference = counts["tokenizers encode_batch, 1 thread"]
    assert all(n == reference for n in counts.values()), counts  # every case made the same tokens

    one = statistics.median(seconds["tokenizers encode_batch, 1 thread"])
    lines = [
        "# Tokenizer throughput: `olmx data tokenize` against `tokenizers`' batch encode",
        "",
        f"## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, `benchmarks/tokenizer_throughput.py --mb {args.mb:g} "
        f"--vocab {args.vocab} --rounds {args.rounds}`",
        "",
        f"{len(files):,} standard-library files ({mib:.1f} MiB, one document each), {reference:,} tokens with a "
        f"byte-level BPE of {tok.get_vocab_size():,} ids trained on them by `tokenizers` "
        f"{__import__('tokenizers').__version__} in {train_s:.1f} s. {cores} cores (os.sched_getaffinity), shared; "
        f"load average (1/5/15 min) at start {' '.join(f'{x:.2f}' for x in load_start)}, at end "
        f"{' '.join(f'{x:.2f}' for x in load_end)}. Medians of {args.rounds} interleaved rounds. olmx rows time the "
        "whole command (read, encode, EOS, write shards + metadata); tokenizers rows time encoding documents "
        "already in memory.",
        "",
        "| | encoding threads | s | tokens/s | tokens/s per thread | vs encode_batch, 1 thread |",
        "|---|---|---|---|---|---|",
    ]
    for name, procs, _ in cases:
        s = statistics.median(seconds[name])
        rate = reference / s
        lines.append(f"| {name} | {procs} | {s:.2f} | {rate:,.0f} | {rate / procs:,.0f} | {one / s:.2f}x |")
    lines.append("")
    lines.append("Per round, s: " + "; ".join(f"{n}: {', '.join(f'{x:.2f}' for x in v)}" for n, v in seconds.items()))
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "tokenize.md").write_text(text)


if __name__ == "__main__":
    main()
