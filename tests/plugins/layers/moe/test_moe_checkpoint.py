"""A checkpoint saved under ``ddp_ep`` with 4 processes resumes with 2 (``ddp_ep``) and 1 process.

One uninterrupted 4-process run (EP degree 4: one expert per rank) trains 4 steps and saves at
step 2. Two copies of its run directory lose everything after step 2 and resume from that
checkpoint with 2 processes (EP degree 2) and with 1 process (no EP). Steps 3 and 4 must log
the losses of the uninterrupted run: step 3's loss checks the loaded weights, step 4's the
loaded optimizer moments. The DCP metadata shows how the experts were stored: one chunk per
EP rank (the experts stay sharded, each rank saves its own) and, after resharding, two or one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import olmx_cli

pytestmark = pytest.mark.dist

#: The smallest run that still has 4 experts over 4 ranks: d_model 32, 2 MoE blocks.
TINY = [
    "trainer.report=false",
    "layers=[moe]",
    "layers.moe.num_experts=4",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.hidden_size=64",
    "data.seq_len=32",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.warmup_steps=1",
    "trainer.max_steps=4",
    "trainer.save_interval=2",
]
EXPERT = "model.blocks.1.moe.experts.w1"


def _train(run_dir: Path, env: dict, *overrides: str) -> tuple[list[float], str]:
    """Losses of steps 1..4 in the run's metrics, and the command's output."""
    proc = olmx_cli("train", *TINY, f"trainer.run_dir={run_dir}", *overrides, env=env)
    log = run_dir / "logs" / "node0.log"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr + (log.read_text()[-3000:] if log.exists() else "")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    return [m["loss"] for m in metrics], proc.stdout


def _expert_chunks(ckpt: Path) -> list[tuple[int, int]]:
    """(first expert, experts) of each stored chunk of one expert weight."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata

    chunks = get_checkpoint_metadata(str(ckpt / "model_and_optim")).state_dict_metadata[EXPERT].chunks
    return sorted((c.offsets[0], c.sizes[0]) for c in chunks)


def test_ddp_ep_checkpoint_of_four_processes_resumes_on_two_and_one(tmp_path):
    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    whole, _ = _train(tmp_path / "ep4", env, "infra.nproc_per_node=4", "parallel=[ddp_ep]", "parallel.ddp_ep.degree=4")
    assert _expert_chunks(tmp_path / "ep4" / "checkpoints" / "step2") == [(0, 1), (1, 1), (2, 1), (3, 1)]

    for name, overrides, chunks in [
        ("ep2", ["infra.nproc_per_node=2", "parallel=[ddp_ep]", "parallel.ddp_ep.degree=2"], [(0, 2), (2, 2)]),
        ("single", ["infra.nproc_per_node=1", "parallel=[]"], [(0, 4)]),
    ]:
        run_dir = tmp_path / name
        shutil.copytree(tmp_path / "ep4", run_dir, ignore=shutil.ignore_patterns("step4"))
        resumed, out = _train(run_dir, env, *overrides)
        assert "Resuming from the checkpoint at step 2" in out, name
        assert resumed == pytest.approx(whole, rel=1e-5), name
        assert _expert_chunks(run_dir / "checkpoints" / "step4") == chunks, name
