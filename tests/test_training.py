"""Real training runs through the real CLI: torchrun, gloo processes, OLMo-core Trainer.

The distributed runs are compared against a single-process reference in the same test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import olmx_cli

pytestmark = pytest.mark.dist

#: A small, fast run: 2-layer d_model 64 model, 8 x 64-token sequences per step.
#: (No end-of-run report: its plots take ~2 s of CPU per run; tests/test_report.py checks it.)
SMALL = [
    "trainer.report=false",
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=256",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.warmup_steps=2",
    "trainer.lr=3e-3",
]
#: The steps of the session's ``reference_run`` (tests/conftest.py): 12 steps, checkpoints at 4, 8, 12.
REFERENCE_STEPS = ["trainer.max_steps=12", "trainer.save_interval=4"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def records(run_dir: Path) -> list[dict]:
    """A run's metrics records, one per line of ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train(run_dir: Path, env: dict, *overrides: str) -> list[dict]:
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={run_dir}", *overrides, env=env)
    log = run_dir / "logs" / "node0.log"
    assert proc.returncode == 0, proc.stdout + proc.stderr + (log.read_text()[-3000:] if log.exists() else "")
    return records(run_dir)


def losses(recs: list[dict]) -> list[float]:
    """The loss of every step, in order."""
    return [r["loss"] for r in recs]


def test_one_and_two_processes_give_the_same_loss_curve(tmp_path, cache, reference_run):
    single = train(
        tmp_path / "p1", cache, *REFERENCE_STEPS, "infra.nproc_per_node=1", "parallel=[]", "trainer.micro_batch_size=4"
    )
    ddp = records(reference_run)  # 2 processes, parallel=[ddp], micro-batch 4
    fsdp = train(tmp_path / "fsdp", cache, *REFERENCE_STEPS, "parallel=[fsdp]", "trainer.micro_batch_size=2")
    hsdp_1x2 = train(tmp_path / "hsdp12", cache, *REFERENCE_STEPS, "parallel=[hsdp]")
    hsdp_2x1 = train(tmp_path / "hsdp21", cache, *REFERENCE_STEPS, "parallel=[hsdp]", "parallel.hsdp.shard_degree=1")
    assert [r["step"] for r in single] == list(range(1, 13))
    for other in (ddp, fsdp, hsdp_1x2, hsdp_2x1):
        assert losses(other) == pytest.approx(losses(single), rel=2e-5)
        # The default evaluation (at the last step, all 32 held-out sequences) agrees too.
        assert [r["eval/loss"] for r in other if "eval/loss" in r] == pytest.approx([single[-1]["eval/loss"]], rel=2e-5)
    plans = [(tmp_path / d / "plan.yaml").read_text() for d in ("hsdp12", "hsdp21")]
    assert "dp_replicate: 1\n  dp_shard: 2" in plans[0] and "dp_replicate: 2\n  dp_shard: 1" in plans[1]
    assert losses(single)[-1] < losses(single)[0] - 0.5  # it learns
    summary = json.loads((reference_run / "summary.json").read_text())
    assert [p["rank"] for p in sorted(summary["processes"], key=lambda p: p["rank"])] == [0, 1]
    assert all(p["tokens_per_s"] > 0 and p["peak_mem_mib"] > 0 for p in summary["processes"])
    assert not (reference_run / "report").exists()  # trainer.report=false


def test_resume_continues_exactly_where_it_stopped(tmp_path, cache, reference_run):
    whole = records(reference_run)
    first = train(tmp_path / "split", cache, *REFERENCE_STEPS, "trainer.stop_at_step=6")
    assert [r["step"] for r in first] == list(range(1, 7))
    assert (tmp_path / "split" / "checkpoints" / "step6").is_dir()
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={tmp_path / 'split'}", *REFERENCE_STEPS, env=cache)
    assert proc.returncode == 0, proc.stderr
    assert "Resuming from the checkpoint at step 6" in proc.stdout
    resumed = records(tmp_path / "split")
    assert [r["step"] for r in resumed] == list(range(1, 13))
    assert losses(resumed) == losses(whole)  # bitwise: same data order, same optimizer state
    # trainer.resume=false starts over in the same directory
    fresh = train(tmp_path / "split", cache, *REFERENCE_STEPS, "trainer.resume=false", "trainer.stop_at_step=3")
    assert [r["step"] for r in fresh] == [1, 2, 3]
    assert not (tmp_path / "split" / "checkpoints" / "step12").exists()
