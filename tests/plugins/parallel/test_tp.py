"""Tensor parallelism (``parallel=[fsdp,tp]``): the mesh and plan rows, every refusal at plan
time, the memory estimate per rank, and training on 2 and 4 gloo processes, under a pipeline too,
equal to one process."""

from __future__ import annotations

from datetime import datetime

import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli
from tests.plugins.parallel.parity import SMALL, copy_as_of, eval_losses, losses

#: One RunPod node of 8 H100s.
H100_8 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.gpus_per_node=8"]


def plan_for(*overrides: str):
    return plan_from_overrides(list(overrides), registry(), now=datetime(2026, 1, 2, 3, 4, 5))


def refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        plan_for(*overrides)
    return info.value


def test_the_mesh_gains_tp_and_the_plan_says_what_each_rank_holds():
    plan = plan_for("parallel=[fsdp,tp]")
    assert plan.mesh.dims() == {"dp": 1, "tp": 2} and plan.mesh.size == 2 and plan.mesh.shards_weights
    assert plan.batch.dp_ranks == 1 and plan.batch.grad_accum == 2  # 16 sequences, micro 8, one data rank
    rows = dict(plan.sections["parallel.tp"])
    assert rows["degree"] == "2 ranks per weight, 1 tensor-parallel group(s)"
    assert rows["per rank"] == (
        "2 of 4 query heads, 2 of 4 kv heads, 256 of 512 feed-forward units, 128 of 256 positions in the norms"
    )
    # 4 x (8 x 256 tokens) x 128 x 4 bytes x 1/2 = 2 MiB
    assert rows["traffic per block"].startswith("2.00 MiB per rank forward")
    four = plan_for("infra.nproc_per_node=4", "parallel=[fsdp,tp]", "trainer.micro_batch_size=4")
    assert four.mesh.dims() == {"dp": 2, "tp": 2} and four.batch.dp_ranks == 2


def test_the_memory_estimate_holds_a_slice_of_the_weights_and_activations():
    """Per rank, tp=2 holds half the parameter, gradient and optimizer bytes of one process and
    half its activations (sequence-parallel norms)."""
    from olmx.plan.resolve import estimate_run

    alone = plan_for("infra.nproc_per_node=1", "parallel=[]", "trainer.micro_batch_size=8")
    sliced = plan_for("parallel=[fsdp,tp]", "trainer.micro_batch_size=8")
    a = estimate_run(alone.run, alone.world, registry()).est
    s = estimate_run(sliced.run, sliced.world, registry()).est
    assert s.params == a.params // 2 and s.optimizer == a.optimizer // 2
    assert s.activations == pytest.approx(a.activations / 2, rel=0.01)


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        (["parallel=[fsdp,tp]", "parallel.tp.degree=3"], "parallel.tp.degree", "3 must divide model.n_heads=4"),
        (
            ["parallel=[fsdp,tp]", "model.n_kv_heads=1"],
            "parallel.tp.degree",
            "2 must divide model.n_kv_heads=1",
        ),
        (["parallel=[fsdp,tp]", "parallel.tp.degree=4"], "parallel.tp", "tp=4 must divide the world size 2"),
        (["parallel=[tp]"], "parallel", "tp=2 needs a data-parallel strategy beside it"),
        (["parallel=[ddp,tp]"], "parallel.ddp", "keeps full replicas, which OLMo-core cannot wrap"),
        (["parallel=[fsdp,tp,ulysses]", "infra.nproc_per_node=4"], "parallel.tp", "with context parallelism"),
        (["parallel=[fsdp,tp]", "layers=[engram]"], "layers.engram", "does not support tensor parallelism"),
        (
            ["parallel=[ddp_ep,tp]", "layers=[moe]", "infra.nproc_per_node=4", "parallel.ddp_ep.degree=2"],
            "parallel.ddp_ep",
            "keeps full replicas",
        ),
        (["parallel=[fsdp,tp]", "parallel.tp.async_tp=true"], "parallel.tp.async_tp", "needs CUDA"),
        (
            [*H100_8, "parallel=[fsdp,tp]", "parallel.tp.async_tp=true", "trainer.compile=false"],
            "parallel.tp.async_tp",
            "set trainer.compile=true",
        ),
    ],
)
def test_what_cannot_work_is_refused_at_plan_time(overrides, field, text):
    err = refusal(*overrides)
    assert err.field == field and text in str(err), str(err)


def test_async_tp_goes_to_olmo_core_where_it_can_run():
    """``parallel.tp.async_tp=true`` on CUDA with the blocks compiled: OLMo-core's
    ``enable_async`` (not run here: it needs GPUs)."""
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    plan = plan_for(*H100_8, "parallel=[fsdp,tp]", "parallel.tp.async_tp=true", "trainer.micro_batch_size=4")
    assert "overlapped with the matmuls (async TP)" in dict(plan.sections["parallel.tp"])["traffic per block"]
    tp = registry().get("parallel", "tp")
    config = tp.apply_train_module(
        plan.run.parallel["tp"],
        TransformerTrainModuleConfig(rank_microbatch_size=4, max_sequence_length=256, optim=AdamWConfig()),
        plan,
        (),
    )
    assert config.tp_config.degree == 2 and config.tp_config.enable_async


def test_parallel_auto_slices_the_weights_where_nothing_without_tensor_parallelism_fits(monkeypatch):
    """OLMo 3 7B at 256k tokens on 8 H100s, with no sequence-parallel plugin installed (Ulysses
    comes before tensor parallelism): no data-parallel layout alone fits, even with every block
    checkpointed, and auto takes the smallest tensor-parallel degree that does."""
    from olmx.registry import reset

    names = [n for kind in ("layers", "parallel", "precision", "infra", "trackers") for n in registry().names(kind)]
    monkeypatch.setenv("OLMX_PLUGINS", ",".join(n for n in names if n != "ulysses"))
    reset()
    try:
        h100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.gpus_per_node=8", "parallel=auto"]
        seq = ["data.seq_len=262144", "trainer.global_batch_size=8", "trainer.micro_batch_size=1"]
        plan = plan_for(*h100, "model=olmo3_7b", *seq)
    finally:
        monkeypatch.delenv("OLMX_PLUGINS")
        reset()
    auto = dict(plan.sections["auto"])
    assert auto["chosen"] == "parallel=[fsdp,tp] parallel.tp.degree=2 trainer.activation_checkpointing=full", auto
    assert plan.mesh.dims() == {"dp": 4, "tp": 2}
    tried = [v for k, v in plan.sections["auto"] if k == "tried before"]
    assert tried and all("> 73.7 GiB" in t for t in tried if not t.startswith("..."))  # each cheaper one refused


@pytest.mark.dist
def test_tp_and_fsdp_by_tp_training_equal_one_process(tmp_path):
    """``parallel=[fsdp,tp]`` on 2 processes (dp=1 x tp=2) and on 4 (dp=2 x tp=2, the 2-D layout),
    and the distributed optimizer x tp on 4, against the same run in one process: the same 6
    losses (within 1e-5; the sliced matmuls and the reductions sum in another order) and the
    same final parameters, read back from the checkpoints as whole tensors (within 1e-4).
    Pipeline x tensor parallel (``parallel=[fsdp,tp,pp]``, 4 processes: 2 stages of one block,
    each sliced over 2 ranks) resumes the one-process run's step-2 checkpoint and trains steps
    3-6 to its losses and weights, one record a step. Every layout's held-out loss at step 6 is that of one process."""
    from tests.worker.test_faults import checkpoint_state

    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    # torch's AdamW, whose loss OLMo-core's pipeline module records on the final stage only (olmx
    # sends it to every rank: else the checkpoint steps, whose metrics arrive in two flushes,
    # logged a second loss of 0.0); the held-out loss at step 6
    run = [*SMALL, "eval.interval=6", "trainer.save_interval=2", "trainer.optimizer=adamw"]
    runs = {"one": ["parallel=[]", "infra.nproc_per_node=1"], "tp": ["parallel=[fsdp,tp]"]}
    runs["fsdp_tp"] = ["parallel=[fsdp,tp]", "infra.nproc_per_node=4"]
    # the distributed optimizer (ZeRO-2) x tp, which parallel=auto may choose
    runs["zero2_tp"] = ["parallel=[ddp,tp]", "parallel.ddp.distributed_optimizer=true", "infra.nproc_per_node=4"]
    runs["tp_pp"] = ["parallel=[fsdp,tp,pp]", "parallel.pp.schedule=1F1B", "infra.nproc_per_node=4"]
    for name, overrides in runs.items():
        if name == "tp_pp":
            copy_as_of(tmp_path / "one", tmp_path / name, 2)
        done = olmx_cli("train", *run, *overrides, f"trainer.run_dir={tmp_path / name}", env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Resuming from the checkpoint at step 2" in done.stdout
    reference = losses(tmp_path / "one")
    assert len(reference) == 6 and reference[-1] < reference[0] - 0.3  # it trains (lr 0.01)
    ref = checkpoint_state(tmp_path / "one" / "checkpoints" / "step6")
    weights = [k for k in ref if k.startswith("model.")]
    assert len(weights) >= 20
    held_out = eval_losses(tmp_path / "one")
    assert list(held_out) == [6]
    for name in ("tp", "fsdp_tp", "zero2_tp", "tp_pp"):
        assert losses(tmp_path / name) == pytest.approx(reference, rel=1e-5, abs=1e-6), name
        assert eval_losses(tmp_path / name) == pytest.approx(held_out, rel=1e-5), name
        state = checkpoint_state(tmp_path / name / "checkpoints" / "step6")
        worst = max((state[k] - ref[k]).abs().max().item() for k in weights)
        assert worst < 1e-4, (name, worst)
