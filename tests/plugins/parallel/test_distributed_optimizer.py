"""The distributed optimizer (``parallel.ddp.distributed_optimizer=true``, ZeRO-2): the plan's
layout and memory per rank, what each rank holds while it trains on 2 gloo processes, and
training equal to one process."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from olmx.plan.resolve import estimate_run, plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli
from tests.plugins.parallel.parity import SMALL, copy_as_of, losses

ZERO2 = ["parallel=[ddp]", "parallel.ddp.distributed_optimizer=true"]


def plan_for(*overrides: str):
    return plan_from_overrides(list(overrides), registry(), now=datetime(2026, 1, 2, 3, 4, 5))


def test_the_plan_shards_optimizer_state_and_gradients_and_keeps_the_parameters_gathered():
    """Per rank, 4 processes: optimizer state and gradients a quarter of ddp's, the float32
    master weights a quarter too, and the whole model gathered in the compute dtype as a buffer
    (FSDP2 kept from the forward to the backward) where fsdp holds two blocks."""
    four = ["infra.nproc_per_node=4", "trainer.micro_batch_size=4"]
    ddp, zero2, fsdp = plan_for(*four, "parallel=[ddp]"), plan_for(*four, *ZERO2), plan_for(*four, "parallel=[fsdp]")
    assert zero2.mesh.dims() == {"dp": 4} and zero2.mesh.shards_params and not zero2.mesh.reshard_after_forward
    assert dict(zero2.sections["parallel.ddp"])["layout"].startswith("distributed optimizer (ZeRO-2)")
    e_ddp, e_z2, e_fsdp = (estimate_run(p.run, p.world, registry()).est for p in (ddp, zero2, fsdp))
    assert e_z2.optimizer == e_ddp.optimizer // 4 == e_fsdp.optimizer
    assert e_z2.grads == e_ddp.grads // 4 and e_z2.params == e_ddp.params // 4
    assert e_z2.activations == e_fsdp.activations
    assert e_z2.buffers >= 4 * zero2.params.total > e_fsdp.buffers  # fp32 on CPU: the whole model gathered


def test_parallel_auto_takes_the_distributed_optimizer_where_replicas_do_not_fit():
    """A 5B model on 8 H100s: full replicas need ~92 GiB a GPU; the distributed optimizer, with
    DDP's communication, fits before any layout that shards the parameters through the step."""
    h100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.gpus_per_node=8", "parallel=auto"]
    model = ["model.d_model=4096", "model.n_layers=24", "model.hidden_size=11008", "model.n_heads=32"]
    plan = plan_for(*h100, *model, "data.seq_len=2048", "trainer.global_batch_size=64", "trainer.micro_batch_size=1")
    auto = dict(plan.sections["auto"])
    # trainer.activation_checkpointing unset: auto tries it too, and says it chose none
    assert (
        auto["chosen"] == "parallel=[ddp] parallel.ddp.distributed_optimizer=true trainer.activation_checkpointing=null"
    )
    tried = auto["tried before"]
    assert tried.startswith("parallel=[ddp] trainer.activation_checkpointing=null: ") and "> 73.7 GiB" in tried
    assert plan.mesh.shards_params and not plan.mesh.reshard_after_forward


def _observe(root: str) -> None:
    """On each of 2 ranks: train one step of the plan and record whether block 0's weights were
    still gathered when block 1 ran its forward, and the optimizer state this rank holds."""
    import os

    import olmo_core.distributed.parallel as olmo_parallel
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from olmx.worker.model import build_model
    from olmx.worker.train import build_trainer

    os.environ["RANK"] = str(dist.get_rank())
    reg = registry()
    out = {}
    for name, overrides in {"zero2": ZERO2, "fsdp": ["parallel=[fsdp]"]}.items():
        common = ["trainer.max_steps=1", "trainer.report=false", "eval.interval=0", f"trainer.run_dir={root}/{name}"]
        plan = plan_from_overrides([*common, *overrides], reg)
        dist.barrier()  # both ranks resolve before either writes into the run dir
        olmo_parallel._WORLD_MESH = None
        model = build_model(plan, reg)
        trainer = build_trainer(plan, reg, model)
        wrapped = trainer.train_module.model
        seen: list[bool] = []
        first = wrapped.blocks["0"].feed_forward.w1
        hook = wrapped.blocks["1"].register_forward_pre_hook(
            lambda *_, first=first, seen=seen: seen.append(not isinstance(first.weight, DTensor))
        )
        trainer.fit()
        hook.remove()
        optim = trainer.train_module.optim
        moments = [s["exp_avg"] for s in optim.state.values()]
        out[name] = {
            "gathered_after_forward": seen,
            "local": sum(m.to_local().numel() for m in moments),
            "global": sum(m.numel() for m in moments),
        }
    Path(root, f"rank{dist.get_rank()}.json").write_text(json.dumps(out))


@pytest.mark.dist
def test_each_rank_keeps_parameters_gathered_and_holds_half_the_optimizer_state(tmp_path):
    from olmo_core.testing import run_distributed_test

    run_distributed_test(_observe, world_size=2, backend="gloo", start_method="spawn", func_args=(str(tmp_path),))
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # one forward per micro-batch: kept gathered (ZeRO-2), resharded after forward (ZeRO-3)
        assert r["zero2"]["gathered_after_forward"] == [True, True], r
        assert r["fsdp"]["gathered_after_forward"] == [False, False], r
        assert r["zero2"]["global"] > 100_000
        assert abs(r["zero2"]["local"] - r["zero2"]["global"] / 2) <= 0.01 * r["zero2"]["global"], r


@pytest.mark.dist
def test_training_with_the_distributed_optimizer_equals_one_process(tmp_path):
    """2 processes with the distributed optimizer against the same run in one process: the same
    6 losses (within 1e-5; the reductions sum in another order) and the same final parameters and
    optimizer moments, read back from the checkpoints as whole tensors (within 1e-4, as the
    tensor-parallel test: 3.3e-5 measured); and its sharded checkpoint resumes on one process."""
    from tests.worker.test_faults import checkpoint_state

    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    # zero2 also saves at step 3: the sharded checkpoint that one process resumes below
    runs = {"one": ["parallel=[]", "infra.nproc_per_node=1"], "zero2": [*ZERO2, "trainer.save_interval=3"]}
    for name, overrides in runs.items():
        done = olmx_cli("train", *SMALL, *overrides, f"trainer.run_dir={tmp_path / name}", env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reference = losses(tmp_path / "one")
    assert len(reference) == 6 and reference[-1] < reference[0] - 0.3  # it trains (lr 0.01)
    assert losses(tmp_path / "zero2") == pytest.approx(reference, rel=1e-5, abs=1e-6)
    ref = checkpoint_state(tmp_path / "one" / "checkpoints" / "step6")
    state = checkpoint_state(tmp_path / "zero2" / "checkpoints" / "step6")
    tensors = [k for k in ref if k.startswith(("model.", "optim.state.")) and hasattr(ref[k], "shape")]
    assert len(tensors) >= 60 and set(tensors) <= set(state)
    worst = max((state[k] - ref[k]).abs().max().item() for k in tensors)
    assert worst < 1e-4, worst

    # the sharded checkpoint of step 3 on 2 processes, resumed on one: the same losses after it
    copy_as_of(tmp_path / "zero2", tmp_path / "resumed", 3)
    assert (tmp_path / "resumed" / "checkpoints" / "step3" / ".metadata.json").is_file()
    one = ["parallel=[]", "infra.nproc_per_node=1", "trainer.save_interval=3"]
    done = olmx_cli("train", *SMALL, *one, f"trainer.run_dir={tmp_path / 'resumed'}", env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert losses(tmp_path / "resumed") == pytest.approx(reference, rel=1e-5, abs=1e-6)


MOE = ["layers=[moe]", "layers.moe.num_experts=4", "layers.moe.top_k=2", "layers.moe.hidden_size=128"]


def test_under_expert_parallel_the_plan_shards_the_dense_optimizer_state():
    """``ddp_ep`` with the distributed optimizer, 4 processes: every parameter's optimizer state
    a quarter per rank (plain ``ddp_ep`` shards only the experts, over 2 x 2 ranks, and
    replicates the dense part)."""
    four = ["infra.nproc_per_node=4", "trainer.micro_batch_size=4", "parallel=[ddp_ep]", *MOE]
    plain, zero2 = plan_for(*four), plan_for(*four, "parallel.ddp_ep.distributed_optimizer=true")
    assert zero2.mesh.dims() == {"dp": 4, "ep": 2} and zero2.mesh.shards_params and not zero2.mesh.reshard_after_forward
    assert dict(zero2.sections["parallel.ddp_ep"])["layout"].startswith("distributed optimizer (ZeRO-2)")
    e_plain, e_z2 = (estimate_run(p.run, p.world, registry()).est for p in (plain, zero2))
    assert e_z2.optimizer == 8 * zero2.params.total // 4 < e_plain.optimizer


@pytest.mark.dist
def test_under_expert_parallel_the_distributed_optimizer_steps_as_replicas_do(tmp_path):
    """2 processes of ``ddp_ep`` (experts over 2 ranks) with and without the distributed
    optimizer for the dense part: the same 6 losses (within 1e-5)."""
    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    runs = {"ddp_ep": [], "zero2": ["parallel.ddp_ep.distributed_optimizer=true"]}
    for name, overrides in runs.items():
        done = olmx_cli(
            "train", *SMALL, "parallel=[ddp_ep]", *MOE, *overrides, f"trainer.run_dir={tmp_path / name}", env=env
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reference = losses(tmp_path / "ddp_ep")
    assert len(reference) == 6 and reference[-1] < reference[0] - 0.3
    assert losses(tmp_path / "zero2") == pytest.approx(reference, rel=1e-5, abs=1e-6)
