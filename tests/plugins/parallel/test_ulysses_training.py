"""Ulysses through the real CLI: torchrun, gloo processes, OLMo-core's train module, against
a single-process run of the same model and data in the same test.

The model is multi-query (1 kv head, replicated for the 2-rank groups) with a sliding window
on its first layer: the two layouts that OLMo-core 3.0.0's own Ulysses code cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import olmx_cli

pytestmark = pytest.mark.dist

SMALL = [
    "trainer.report=false",
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=256",
    "model.n_kv_heads=1",
    "model.sliding_window=[16]",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.warmup_steps=2",
    "trainer.lr=3e-3",
    "trainer.max_steps=6",
    "trainer.save_interval=100",
]


def train(run_dir: Path, env: dict, *overrides: str) -> list[float]:
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={run_dir}", *overrides, env=env)
    log = run_dir / "logs" / "node0.log"
    assert proc.returncode == 0, proc.stdout + proc.stderr + (log.read_text()[-3000:] if log.exists() else "")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 7))
    return [r["loss"] for r in records]


def test_ddp_by_ulysses_over_four_processes_matches_one_process(tmp_path, tmp_path_factory):
    """2 data-parallel ranks x 2 sequence ranks, with the long-context checkpointing policy.

    (FSDP x Ulysses, the long_context recipe's composition, was checked the same way by hand:
    benchmarks/results/ulysses.md; a third run here would cost ~40 s of CPU in CI.)
    """
    env = {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    single = train(tmp_path / "p1", env, "infra.nproc_per_node=1", "parallel=[]", "trainer.micro_batch_size=4")
    ddp = train(
        tmp_path / "ddp",
        env,
        "infra.nproc_per_node=4",
        "parallel=[ddp,ulysses]",
        "trainer.micro_batch_size=2",
        "trainer.activation_checkpointing=long_context",
    )
    assert ddp == pytest.approx(single, rel=2e-5)
    assert single[-1] < single[0] - 0.1  # it learns
    # The held-out loss at the last step, its sequences split over the sequence-parallel ranks.
    last = [json.loads((tmp_path / d / "metrics.jsonl").read_text().splitlines()[-1]) for d in ("p1", "ddp")]
    assert last[1]["eval/loss"] == pytest.approx(last[0]["eval/loss"], rel=2e-5)
    import yaml

    mesh = yaml.safe_load((tmp_path / "ddp" / "plan.yaml").read_text())["mesh"]
    assert (mesh["cp"], mesh["dp_replicate"], mesh["dp_shard"]) == (2, 2, 1)
