"""Token data: byte-level caches written once and reused; OLMo-core numpy files as given."""

from __future__ import annotations

import json

import numpy as np
import pytest

from olmx.config.schema import DataConfig
from olmx.worker.data import stdlib_files, token_files
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


def test_stdlib_corpus_is_the_standard_library_only():
    files = stdlib_files()
    assert len(files) > 500
    assert all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    assert any(f.name == "argparse.py" for f in files)


@pytest.mark.dist
def test_numpy_token_files_train(tmp_path):
    rng = np.random.default_rng(0)
    # a learnable stream: repeating ramps over a 500-token vocabulary
    tokens = (np.arange(200_000) % 97 + rng.integers(0, 3, 200_000)).astype(np.uint16)
    tokens.tofile(tmp_path / "part-0.npy")
    run = tmp_path / "run"
    proc = olmx_cli(
        "train",
        "data=numpy",
        f"data.paths=[{tmp_path}/part-*.npy]",
        "data.seq_len=64",
        "data.tokenizer.vocab_size=500",
        "data.tokenizer.eos_id=499",
        "data.tokenizer.pad_id=498",
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
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 15 and losses[-1] < losses[0] - 1.0
