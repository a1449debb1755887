"""bf16, emulated MXFP8 and emulated FP8 training through the real CLI (torchrun, gloo, OLMo-core Trainer),
each compared with a float32 run of the same model, data and seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import olmx_cli

pytestmark = pytest.mark.dist

#: A tiny model whose linear layers all have dimensions divisible by 32 (128 tokens per micro-batch).
TINY = [
    "trainer.report=false",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
    "model.hidden_size=64",
    "data.seq_len=32",
    "trainer.global_batch_size=8",
    "trainer.warmup_steps=5",
    "trainer.lr=3e-3",
    "trainer.save_interval=1000",
]
ONE = ["infra.nproc_per_node=1", "parallel=[]", "trainer.micro_batch_size=8"]
TWO = ["infra.nproc_per_node=2", "trainer.micro_batch_size=4"]
EMULATE = ["precision=mxfp8", "precision.emulate=true"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def train(run_dir: Path, env: dict, steps: int, *overrides: str) -> tuple[list[float], str]:
    proc = olmx_cli("train", *TINY, f"trainer.max_steps={steps}", f"trainer.run_dir={run_dir}", *overrides, env=env)
    log = run_dir / "logs" / "node0.log"
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + text[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    return [r["loss"] for r in records], text


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def fp32(tmp_path_factory, cache) -> list[float]:
    losses, _ = train(tmp_path_factory.mktemp("fp32"), cache, 50, *ONE)
    assert losses[-1] < losses[0] - 1.5  # the reference learns
    return losses


@pytest.fixture(scope="module")
def mxfp8_ddp(tmp_path_factory, cache) -> tuple[list[float], str]:
    return train(tmp_path_factory.mktemp("mxfp8_ddp"), cache, 50, *TWO, "parallel=[ddp]", *EMULATE)


def test_emulated_mxfp8_with_ddp_tracks_fp32_for_50_steps(mxfp8_ddp, fp32):
    losses, log = mxfp8_ddp
    assert "MXFP8 (emulated): 14 linear layers converted" in log
    assert "kept in high precision: lm_head.w_out" in log
    assert losses != fp32  # the MX layers really quantize ...
    assert max_rel_diff(losses, fp32) < 0.01  # ... and training stays within 1% (measured: 6e-4)
    assert abs(losses[-1] - fp32[-1]) / fp32[-1] < 0.005


def test_emulated_mxfp8_composes_with_fsdp_bf16_mixed_precision(tmp_path, cache, fp32):
    """The SM100 recipe's layout: FSDP all-gathers bfloat16 parameters into the MX layers.
    ``stop_at_step`` keeps the 50-step learning-rate schedule, so the steps compare one to one."""
    losses, log = train(tmp_path, cache, 50, *TWO, "parallel=[fsdp]", *EMULATE, "trainer.stop_at_step=10")
    assert "MXFP8 (emulated): 14 linear layers converted" in log
    assert len(losses) == 10 and losses != fp32[:10]
    assert max_rel_diff(losses, fp32[:10]) < 0.01  # measured: 2e-4


def test_bf16_autocast_tracks_fp32(tmp_path, cache, fp32):
    """25 steps of the 50-step schedule (bf16 is the slowest mode on CPUs without bf16 units)."""
    losses, _ = train(tmp_path, cache, 50, *ONE, "precision=bf16", "trainer.stop_at_step=25")
    assert len(losses) == 25 and losses != fp32[:25]
    assert max_rel_diff(losses, fp32[:25]) < 0.01  # measured over 50 steps: 4e-4


@pytest.mark.parametrize(
    "layer, parallel, converted",
    [
        # MoE blocks under HSDP (1 replica x 2 shards): attention linears convert, experts stay grouped weights.
        (["layers=[moe]", "layers.moe.num_experts=4", "layers.moe.top_k=2"], ["parallel=[hsdp]"], 8),
        # Engram (tables and projections kept) under 2-way Ulysses: 128 / 2 = 64 tokens per linear layer.
        (["layers=[engram]", "layers.engram.layer_ids=[1]"], ["parallel=[ddp,ulysses]"], 14),
    ],
    ids=["moe-hsdp", "engram-ulysses"],
)
def test_emulated_mxfp8_composes_with_layer_plugins_and_parallel_strategies(
    tmp_path, cache, layer, parallel, converted
):
    """2 processes with MXFP8 against 1 float32 process of the same model: the conversion the
    plan lists happens, and the first 8 steps of the 50-step schedule stay within 2%."""
    reference, _ = train(tmp_path / "fp32", cache, 50, *ONE, *layer, "trainer.stop_at_step=8")
    losses, log = train(tmp_path / "mxfp8", cache, 50, *TWO, *parallel, *layer, *EMULATE, "trainer.stop_at_step=8")
    assert f"MXFP8 (emulated): {converted} linear layers converted" in log
    assert len(losses) == 8 and losses != reference
    assert max_rel_diff(losses, reference) < 0.02


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_fp8_with_ddp_tracks_fp32(tmp_path, cache, fp32, recipe):
    """torchao's float8 recipes, emulated on 2 processes: the planned layers convert and the
    first 15 steps of the 50-step schedule stay within 1% of float32 on 1 process."""
    losses, log = train(
        tmp_path,
        cache,
        50,
        *TWO,
        "parallel=[ddp]",
        "precision=fp8",
        f"precision.recipe={recipe}",
        "precision.emulate=true",
        "trainer.stop_at_step=15",
    )
    assert f"FP8 ({recipe}, emulated): 14 linear layers converted" in log
    assert len(losses) == 15 and losses != fp32[:15]
    assert max_rel_diff(losses, fp32[:15]) < 0.01
