"""The engram layer plugin through the real CLI: plan, refusals, distributed equality."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from olmx.cli import app
from tests.conftest import olmx_cli

TINY = ["layers=[engram]", "layers.engram.n_embed_per_ngram=64", "model.d_model=64", "model.n_layers=2",
        "model.hidden_size=128", "data.seq_len=64", "trainer.global_batch_size=8", "trainer.micro_batch_size=4",
        "trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.save_interval=100"]


def dry_run(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner().invoke(app, ["train", "--dry-run", *args])


def test_plan_shows_tables_and_traffic(tmp_path, monkeypatch):
    from olmx_plugins.layers.engram import NgramHasher

    out = dry_run(tmp_path, monkeypatch, *TINY).stdout
    sizes = NgramHasher(layer_ids=[1], max_ngram_size=3, n_head_per_ngram=8, vocab_size_per_ngram=[1920, 1920],
                        pad_id=0, seed=0, compressed_vocab_size=355).table_sizes(1)
    assert f"block 1: 16 heads, {sum(sizes):,} rows x 8, {sum(sizes) * 8:,} params" in out
    assert "lookups per step" in out and f"{8 * 64 * 16:,} rows" in out


@pytest.mark.parametrize(
    ("args", "field", "text"),
    [
        (["layers.engram.layer_ids=[5]"], "layers.engram.layer_ids", "[5] outside [0, model.n_layers=2)"),
        (["layers.engram.n_embed_per_ngram=60"], "layers.engram.n_embed_per_ngram", "divisible by layers.engram.n_head_per_ngram=8"),
        (["layers.engram.vocab_size_per_ngram=[100]"], "layers.engram.vocab_size_per_ngram", "needs 2 entries"),
        (["layers.engram.sharding=3d"], "layers.engram.sharding", "replicated, 1d, 2d"),
        (["layers.engram.sharding=2d"], "layers.engram.shard_degree", "sharding=2d needs a shard_degree"),
    ],
)
def test_refusals(tmp_path, monkeypatch, args, field, text):
    result = dry_run(tmp_path, monkeypatch, *TINY, *args)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"error: {field}: ") and text in result.stderr


def test_experiments_resolve(tmp_path, monkeypatch):
    assert dry_run(tmp_path, monkeypatch, "experiment=engram_tiny").exit_code == 0
    (tmp_path / "tokens.npy").write_bytes(b"\0" * 64)
    out = dry_run(tmp_path, monkeypatch, "experiment=engram_3p5b", f"data.paths=[{tmp_path}/tokens.npy]")
    assert out.exit_code == 0, out.stderr
    total = int(next(line for line in out.stdout.splitlines() if "│ parameters " in line).split("│")[2].split()[0].replace(",", ""))
    assert 3.3e9 < total < 3.7e9
    assert "dp_replicate=1 x dp_shard=4" in out.stdout and "bfloat16" in out.stdout


@pytest.mark.dist
def test_sharded_and_distributed_runs_equal_the_single_process_run(tmp_path):
    def run(name: str, *extra: str) -> list[float]:
        d = tmp_path / name
        proc = olmx_cli("train", *TINY, f"trainer.run_dir={d}", *extra)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]

    single = run("single", "infra.nproc_per_node=1", "parallel=[]")
    ddp = run("ddp", "parallel=[ddp]")
    sharded = run("ddp_1d", "parallel=[ddp]", "layers.engram.sharding=1d")
    assert len(single) == 6 and single[-1] < single[0] - 0.3
    assert ddp == pytest.approx(single, rel=2e-5)
    assert sharded == pytest.approx(single, rel=2e-5)
