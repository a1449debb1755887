"""Token data: byte-level caches written once and reused; OLMo-core numpy files as given, and
``np.save``'d files read through their header; the plan-time checks of token files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from olmx.config.schema import DataConfig, TokenizerConfig
from olmx.data.files import (
    SAMPLE_WINDOW,
    SAMPLE_WINDOWS,
    inspect_token_file,
    npy_header,
    stdlib_files,
    token_dtype,
    token_files,
)
from olmx.errors import ConfigError
from tests.conftest import olmx_cli


def test_text_is_tokenized_byte_level_once(tmp_path):
    (tmp_path / "a.txt").write_text("héllo")
    (tmp_path / "b.txt").write_text("ok")
    data = DataConfig(name="text", paths=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "cache"))
    [path] = token_files(data)
    tokens = np.fromfile(path, dtype=np.uint16)
    assert tokens.tolist() == [*"héllo".encode(), 256, *b"ok", 256]
    before = (tmp_path / "cache").stat().st_mtime_ns, len(list((tmp_path / "cache").iterdir()))
    assert token_files(data) == [path]
    assert ((tmp_path / "cache").stat().st_mtime_ns, len(list((tmp_path / "cache").iterdir()))) == before
    (tmp_path / "b.txt").write_text("changed")
    assert token_files(data) != [path]  # a changed file means a new cache


def test_a_full_cache_is_one_line_naming_the_setting_the_path_and_the_error(tmp_path, monkeypatch):
    """A full disk (ENOSPC) while the cache is written: one ConfigError naming data.cache_dir, the
    cache and the error, and no half-written file left (was an OSError traceback in every worker)."""
    import errno
    import os
    from contextlib import contextmanager

    from olmx import writable

    real = writable.atomic_file

    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @contextmanager
    def full_disk(out: Path):
        with real(out):
            yield Full()

    monkeypatch.setattr(writable, "atomic_file", full_disk)
    (tmp_path / "a.txt").write_text("hello")
    cache = tmp_path / "cache"
    data = DataConfig(name="text", paths=[str(tmp_path / "a.txt")], cache_dir=str(cache))
    with pytest.raises(ConfigError) as info:
        token_files(data)
    assert str(info.value) == (
        f"data.cache_dir: cannot write the token cache in '{cache}': No space left on device "
        "(data.cache_dir=DIR or $OLMX_CACHE_DIR chooses another place)"
    )
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []  # nothing half-written

    def unreadable(self: Path) -> bytes:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.raises(PermissionError):  # an input that cannot be read is not the cache's fault
        token_files(data)


def test_stdlib_corpus_is_the_standard_library_only():
    files = stdlib_files()
    assert len(files) > 500
    assert all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    assert any(f.name == "argparse.py" for f in files)


def test_token_dtype_is_olmo_cores_choice():
    from olmo_core.data import NumpyFSLDatasetConfig
    from olmo_core.data import TokenizerConfig as CoreTokenizer

    for vocab in (9, 256, 257, 500, 65_536, 65_537, 100_278):
        core = NumpyFSLDatasetConfig(
            tokenizer=CoreTokenizer(vocab_size=vocab, eos_token_id=0, pad_token_id=0),
            paths=["unused"],
            sequence_length=8,
        )
        assert token_dtype(vocab) == np.dtype(core.get_dtype()).name, vocab
    assert [token_dtype(v) for v in (256, 257, 65_536, 65_537)] == ["uint8", "uint16", "uint16", "uint32"]


def numpy_data(tmp_path, *paths) -> DataConfig:
    return DataConfig(
        name="numpy",
        paths=[str(p) for p in paths],
        seq_len=64,
        tokenizer=TokenizerConfig(name="t", vocab_size=500, eos_id=499, pad_id=498),
        cache_dir=str(tmp_path / "cache"),
    )


def test_np_saved_files_are_read_through_their_header_exactly(tmp_path):
    """OLMo-core's own dataset, given token_files(), reads exactly the np.save'd ids (int64, 2-D)."""
    from olmo_core.data import NumpyFSLDatasetConfig
    from olmo_core.data import TokenizerConfig as CoreTokenizer

    rng = np.random.default_rng(1)
    saved = rng.integers(0, 500, (50, 64)).astype(np.int64)
    np.save(tmp_path / "part-0.npy", saved)
    raw = rng.integers(0, 500, 64 * 7).astype(np.uint16)
    raw.tofile(tmp_path / "part-1.bin")
    data = numpy_data(tmp_path, tmp_path / "part-0.npy", tmp_path / "part-1.bin")
    copy, same = token_files(data)
    assert same == str(tmp_path / "part-1.bin")  # a raw file is used as it is
    assert Path(copy).parent == tmp_path / "cache" and copy.endswith(".uint16")
    assert np.fromfile(copy, dtype=np.uint16).tolist() == saved.ravel().tolist()
    written = Path(copy).stat().st_mtime_ns
    assert token_files(data) == [copy, same] and Path(copy).stat().st_mtime_ns == written  # written once

    core = NumpyFSLDatasetConfig(
        tokenizer=CoreTokenizer(vocab_size=500, eos_token_id=499, pad_token_id=498),
        paths=token_files(data),
        sequence_length=64,
        work_dir=str(tmp_path / "work"),
    ).build()
    core.prepare()
    assert len(core) == 57
    expected = [*saved.tolist(), *raw.reshape(7, 64).tolist()]
    assert [core[i]["input_ids"].tolist() for i in range(len(core))] == expected


def test_inspect_reads_headers_sizes_and_a_sample(tmp_path):
    ids = np.arange(100_000) % 500
    np.save(tmp_path / "a.npy", ids.astype(np.int32).reshape(1000, 100))
    ids.astype(np.uint16).tofile(tmp_path / "b.bin")
    a = inspect_token_file(tmp_path / "a.npy", 500)
    assert (a.tokens, a.dtype, a.header) == (100_000, "int32", True)
    assert npy_header(tmp_path / "a.npy").shape == (1000, 100)
    b = inspect_token_file(tmp_path / "b.bin", 500)
    assert (b.tokens, b.dtype, b.header) == (100_000, "uint16", False)
    # A bad id in a sampled window (the last one ends at the end of the file) is found ...
    bad = ids.astype(np.uint16)
    bad[-1] = 501
    bad.tofile(tmp_path / "c.bin")
    with pytest.raises(ConfigError, match=r"'.*c.bin' holds token id 501 at position 99,999 \(in a sample"):
        inspect_token_file(tmp_path / "c.bin", 500)
    # ... the plan reads at most SAMPLE_WINDOWS windows: one between them is only found by the copy.
    assert 100_000 > SAMPLE_WINDOW * SAMPLE_WINDOWS
    hidden = ids.astype(np.int64)
    hidden[SAMPLE_WINDOW + 10] = 777
    np.save(tmp_path / "d.npy", hidden)
    assert inspect_token_file(tmp_path / "d.npy", 500).tokens == 100_000
    data = numpy_data(tmp_path, tmp_path / "d.npy")
    with pytest.raises(ConfigError, match=r"'.*d.npy' holds token id 777 at position 4,106, outside the vocabulary"):
        token_files(data)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []  # no partial copy
    # A raw file is read by OLMo-core as it is: the worker scans every id once, before training.
    hidden.astype(np.uint16).tofile(tmp_path / "e.bin")
    assert inspect_token_file(tmp_path / "e.bin", 500).tokens == 100_000  # the plan's sample misses it
    raw = numpy_data(tmp_path, tmp_path / "e.bin")
    with pytest.raises(ConfigError, match=r"'.*e.bin' holds token id 777 at position 4,106, outside the vocabulary"):
        token_files(raw)
    marks = tmp_path / "cache" / "scanned"
    assert not [p for p in marks.iterdir() if p.name.startswith("e-") and p.suffix != ".lock"]  # not marked
    ids.astype(np.uint16).tofile(tmp_path / "f.bin")
    good = numpy_data(tmp_path, tmp_path / "f.bin")
    assert token_files(good) == [str(tmp_path / "f.bin")]
    [mark] = [p for p in marks.iterdir() if p.name.startswith("f-") and p.suffix != ".lock"]
    seen = mark.stat().st_mtime_ns
    assert token_files(good) == [str(tmp_path / "f.bin")] and mark.stat().st_mtime_ns == seen  # scanned once


@pytest.mark.dist
def test_numpy_token_files_train(tmp_path):
    """A raw uint16 file and the same ids np.save'd as int64 train identically."""
    rng = np.random.default_rng(0)
    # a learnable stream: repeating ramps over a 500-token vocabulary
    tokens = (np.arange(200_000) % 97 + rng.integers(0, 3, 200_000)).astype(np.uint16)
    tokens.tofile(tmp_path / "part-0.npy")
    (tmp_path / "saved").mkdir()
    np.save(tmp_path / "saved" / "part-0.npy", tokens.astype(np.int64))
    losses = {}
    for name, files in (("raw", f"{tmp_path}/part-*.npy"), ("saved", f"{tmp_path}/saved/part-*.npy")):
        run = tmp_path / f"run-{name}"
        proc = olmx_cli(
            "train",
            "data=numpy",
            f"data.paths=[{files}]",
            "data.seq_len=64",
            "data.tokenizer.vocab_size=500",
            "data.tokenizer.eos_id=499",
            "data.tokenizer.pad_id=498",
            f"data.cache_dir={tmp_path / 'cache'}",
            "model.d_model=64",
            "model.n_layers=1",
            "model.hidden_size=128",
            "infra.nproc_per_node=1",
            "parallel=[]",
            "trainer.global_batch_size=4",
            "trainer.micro_batch_size=4",
            "trainer.max_steps=15",
            "trainer.warmup_steps=2",
            "trainer.report=false",
            f"trainer.run_dir={run}",
        )
        assert proc.returncode == 0, proc.stderr
        assert "512 (padded)" in proc.stdout
        losses[name] = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses["raw"]) == 15 and losses["raw"][-1] < losses["raw"][0] - 1.0
    assert losses["saved"] == losses["raw"]  # exactly the saved ids, in the same order
