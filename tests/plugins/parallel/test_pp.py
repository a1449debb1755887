"""Pipeline parallelism (``parallel=[...,pp]``): the plan (stages, micro-batches, bubble, memory
per stage, refusals) and training on gloo processes equal to one process, resumed across a change
of pipeline degree both ways."""

from __future__ import annotations

from datetime import datetime

import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import estimate_run, plan_from_overrides
from olmx.registry import registry
from olmx_plugins.parallel.pp import bubble, in_flight
from tests.conftest import olmx_cli
from tests.plugins.parallel.parity import copy_as_of, eval_losses, losses

#: 4 blocks (so that the interleaved schedules have 2 stages per rank at degree 2), 8 steps, a
#: checkpoint every 2, the held-out loss every 4 (olmx's forward-only pass through the stages).
#: The training test makes blocks 1 and 3 MoE blocks (:data:`MOE`): each stage holds a dense
#: block and an MoE block (:data:`MOE_ENGRAM` adds Engram to blocks 0 and 3).
RUN = [
    "trainer.report=false",
    "model.d_model=64",
    "model.n_layers=4",
    "model.hidden_size=256",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.max_steps=8",
    "trainer.save_interval=2",
    "trainer.warmup_steps=2",
    "eval.interval=4",
]
PP = ["parallel=[ddp,pp]"]
MOE = ["layers=[moe]", "layers.moe.every=2", "layers.moe.num_experts=4", "layers.moe.hidden_size=128"]
#: The training test's layers: MOE, and Engram on blocks 0 and 3 (on the first and the last stage).
MOE_ENGRAM = ["layers=[engram,moe]", *MOE[1:], "layers.engram.layer_ids=[0,3]"]


def plan_for(*overrides: str):
    return plan_from_overrides([*RUN, *overrides], registry(), now=datetime(2026, 1, 2, 3, 4, 5))


def test_the_plan_splits_the_blocks_and_counts_one_stage_per_rank():
    one, pp = plan_for("infra.nproc_per_node=1", "parallel=[]"), plan_for(*PP)
    assert pp.mesh.dims() == {"dp": 1, "pp": 2}
    rows = dict(pp.sections["parallel.pp"])
    assert rows["stages"].startswith("4 (2 per rank, Interleaved1F1B) of ~1 blocks")
    assert rows["micro-batches"].startswith("4 per pipeline per step")  # 8 / (1 dp rank x 2)
    reg = registry()
    e_one, e_pp = estimate_run(one.run, one.world, reg).est, estimate_run(pp.run, pp.world, reg).est
    # A rank holds half the blocks and one of the two vocab x d matrices (embedding or head).
    v, d = pp.vocab_size, 64
    assert e_pp.params == 4 * ((pp.params.total - 2 * v * d) // 2 + v * d)
    assert e_pp.optimizer == 2 * e_pp.params < e_one.optimizer
    # Interleaved 1F1B at degree 2 keeps 2 (degree - 1) + degree + 1 = 5 chunks of 1 block: 3
    # stages' worth (2 blocks each) of a micro-batch's activations.
    assert e_pp.inflight == in_flight("Interleaved1F1B", 2, 4) == 3


def test_expert_parallelism_within_each_stage():
    """ddp_ep x pp: the experts of a stage sharded over its data-parallel ranks; a rank holds its
    stage's blocks (half) and 1/ep of their experts."""
    reg, ep = registry(), ["parallel.ddp_ep.degree=2", "infra.nproc_per_node=4", *MOE]
    both = plan_for("parallel=[ddp_ep,pp]", *ep)
    assert both.mesh.dims() == {"dp": 2, "pp": 2, "ep": 2}
    assert both.mesh.expert_mesh_shape() == (1, 2)
    assert dict(both.sections["layers.moe"])["expert parallel"] == (
        "2 experts per rank over 2 ranks, 1 replica group(s) per pipeline stage"
    )
    flat = plan_for("parallel=[ddp_ep]", *ep)
    experts = 2 * 3 * 4 * 64 * 128  # 2 MoE blocks of 4 SwiGLU(64 -> 128) experts
    e_both, e_flat = (estimate_run(p.run, p.world, reg).est for p in (both, flat))
    v, d, total = both.vocab_size, 64, both.params.total
    # dense: half the blocks and one vocab x d matrix; experts: half of the 1/ep of them a rank holds
    assert e_both.params == 4 * ((total - experts - 2 * v * d) // 2 + v * d) + 4 * (experts // 2) // 2
    # without the pipeline the 4 ranks are 2 replicas of each expert group, which split a rank's experts
    assert e_flat.params == 4 * (total - experts) + 4 * experts // 4


def test_tensor_parallelism_slices_each_stage():
    """fsdp x tp x pp on 4 processes: each of the 2 stages sliced over 2 ranks, which hold half of
    what a rank of the pipeline alone holds (weights, optimizer state, activations in flight).
    Training is compared with one process in tests/plugins/parallel/test_tp.py."""
    reg = registry()
    both, pp = plan_for("parallel=[fsdp,tp,pp]", "infra.nproc_per_node=4"), plan_for(*PP)
    assert both.mesh.dims() == {"dp": 1, "tp": 2, "pp": 2}
    e_both, e_pp = (estimate_run(p.run, p.world, reg).est for p in (both, pp))
    assert (2 * e_both.params, 2 * e_both.optimizer, 2 * e_both.activations) == (
        e_pp.params,
        e_pp.optimizer,
        e_pp.activations,
    )
    assert e_both.inflight == e_pp.inflight == 3


def test_schedules_their_bubbles_and_what_they_keep():
    assert bubble("1F1B", 4, 8) == pytest.approx(3 / 11)
    assert bubble("Interleaved1F1B", 4, 8) == pytest.approx(3 / 19)  # 2 stages per rank halve it
    assert [in_flight("1F1B", 4, m) for m in (2, 8)] == [2, 4]
    assert in_flight("GPipe", 4, 8) == 8  # every forward before any backward
    # The time model stretches the step by the bubble on a GPU.
    h100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.gpus_per_node=8"]
    plan = plan_for(*h100, *PP, "parallel.pp.degree=4", "parallel.pp.schedule=1F1B", "trainer.global_batch_size=32")
    assert "with 27% of it idle (pipeline bubble)" in dict(plan.sections["time"])["step time"]


def test_parallel_auto_tries_a_pipeline_after_every_other_add_on():
    """``parallel=auto`` on 4 processes: pipelines of degree 2 and 4 are candidates, after the
    layouts without an add-on and those with sequence or tensor parallelism; then tensor x
    pipeline parallel (3-D), which the plan accepts as written out where the degrees fit."""
    from olmx.config.compose import compose, to_object
    from olmx.plan.auto import parallel_options

    reg = registry()
    run = to_object(compose([*RUN, "parallel=auto", "infra.nproc_per_node=4"], reg), reg)
    world = reg.get("infra", run.infra_name).world(run.infra[run.infra_name])
    names = [" ".join(o.overrides) for o in parallel_options(run, world, reg)]
    pipelines = [i for i, n in enumerate(names) if ",pp]" in n and ",tp," not in n]
    assert pipelines and min(pipelines) > max(i for i, n in enumerate(names) if ",pp]" not in n)
    assert any("parallel.pp.degree=4" in names[i] for i in pipelines)
    both = [i for i, n in enumerate(names) if ",tp,pp]" in n]
    assert both and min(both) > max(pipelines) and not any("ulysses" in names[i] for i in both)
    three_d = "parallel=[fsdp,tp,pp] parallel.tp.degree=2 parallel.pp.degree=2"
    assert three_d in names
    assert plan_for(*three_d.split(), "infra.nproc_per_node=4").mesh.dims() == {"dp": 1, "tp": 2, "pp": 2}


@pytest.mark.parametrize(
    ("overrides", "field", "match"),
    [
        (["eval.downstream=[arc_easy]"], "eval.downstream", "logits, which a pipeline's last stage does not return"),
        (["trainer.global_batch_size=2"], "trainer.global_batch_size", "1 micro-batch.* fewer than its 2 stages"),
        (
            ["parallel.pp.degree=4", "infra.nproc_per_node=4", "model.n_layers=2"],
            "parallel.pp.degree",
            "1F1B .* 4 stages",
        ),
        (["parallel.pp.schedule=Interleaved1F1B", "model.n_layers=2"], "parallel.pp.schedule", "4 stages .* more than"),
        (
            ["layers=[engram]", "layers.engram.layer_ids=[1]", "layers.engram.sharding=1d"],
            "layers.engram.sharding",
            "only the ranks of the stage that holds its block look up",
        ),
    ],
)
def test_refusals_name_the_field(overrides, field, match):
    with pytest.raises(ConfigError, match=match) as err:
        plan_for(*PP, *overrides)
    assert err.value.field == field


def test_a_layer_that_does_not_declare_pipeline_support_is_refused():
    """A layer plugin without ``pipeline_parallel`` (the default: its blocks might read inputs
    only the first stage has) is refused under a pipeline, naming it and what to do."""
    from dataclasses import replace

    from olmx.api import Context, LayerPlugin
    from olmx.plan.mesh import check_tensor_parallel

    class Tokens(LayerPlugin):
        name = "tokens"

    plan = plan_for(*PP)
    ctx = Context(plan.run, plan.world, plan.mesh, plan.dtypes, plan.vocab_size, layers=((Tokens(), None),))
    with pytest.raises(ConfigError, match="does not support pipeline parallelism .* pp=2") as err:
        check_tensor_parallel(ctx)
    assert err.value.field == "layers.tokens"
    check_tensor_parallel(replace(ctx, mesh=plan_for("parallel=[ddp]").mesh))  # no pipeline: accepted


def test_engram_tables_sit_on_their_stage_replicated():
    """Engram under a pipeline: ``sharding=auto`` replicates the tables (a sharded table's
    lookups would be exchanged among ranks of other stages too)."""
    plan = plan_for(*PP, "layers=[engram]", "layers.engram.layer_ids=[1,3]")
    assert dict(plan.sections["layers.engram"])["sharding"].startswith("replicated (auto: a pipeline")


def test_a_fresh_pipeline_starts_from_the_one_model_of_its_seed(tmp_path):
    """A fresh ``parallel=[ddp,pp]`` run (2 processes, Interleaved1F1B: each rank holds two
    stages of one block, the second stage of each rank drawn after blocks another rank holds)
    has the losses of one process at the same ``trainer.seed``: every stage starts from its part
    of the one model (olmx.worker.pipeline.OneModelInit). Measured 4.8e-7 apart over 8 steps
    (1F1B too, and fsdp x tp x pp on 4 processes); OLMo-core's own per-stage seeds were up to
    0.11 apart (first loss 6.020 against 5.914)."""
    cache = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    fresh = [*RUN, "trainer.max_steps=3", "trainer.save_interval=3", "eval.interval=0"]

    def train(run, *overrides):
        proc = olmx_cli("train", *fresh, f"trainer.run_dir={tmp_path / run}", *overrides, env=cache)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return losses(tmp_path / run)

    one = train("one", "infra.nproc_per_node=1", "parallel=[ddp]")
    pipelined = train("pp", *PP, "parallel.pp.schedule=Interleaved1F1B")
    assert len(one) == 3 and one[-1] < one[0]
    assert pipelined == pytest.approx(one, abs=1e-5)


def test_pipelines_train_as_one_process_and_resume_across_degrees(tmp_path):
    """A model of dense and MoE blocks, two of them with Engram (hashing the token ids the
    pipeline passes to every stage). One process for 8 steps; from its step-2 checkpoint, pipelines of
    degree 2 on 4 processes (1F1B under Ulysses 2: each sequence sharded over 2 ranks through
    every stage; Interleaved1F1B under ddp_ep 2 x pp 2: each stage's dense parameters
    replicated over its 2 data-parallel ranks, its experts sharded over them) train steps 3-8
    with the losses of one process (within 2e-5 relative, as tests/test_training.py compares
    layouts: 9e-6 with 2 data-parallel ranks, 0 at dp 1) and evaluate the held-out sequences at
    steps 4 and 8 to its held-out losses (each evaluation between two training steps of the
    schedule, which it leaves as it was); the 1F1B pipeline's step-4 checkpoint resumes on one
    process to the same losses. (1F1B alone, GPipe, ddp x pp, fsdp x ulysses x pp and ZeRO-2 x
    pp were checked by hand the same way.)"""
    ref, cache = tmp_path / "ref", {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    one = ["infra.nproc_per_node=1", "parallel=[]"]

    def train(run, *overrides):
        proc = olmx_cli("train", *RUN, *MOE_ENGRAM, f"trainer.run_dir={run}", *overrides, env=cache)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return losses(run), eval_losses(run)

    # The one-process run, whole; the pipelines start from its step-2 checkpoint (a resume
    # equals the run left alone bit for bit: tests/test_training.py).
    want, want_eval = train(ref, *one)
    assert len(want) == 8 and sorted(want_eval) == [4, 8]
    variants: dict[str, tuple[list[str], str]] = {
        "ddp x ulysses 2 x 1F1B": (
            ["parallel=[ddp,ulysses,pp]", "parallel.pp.schedule=1F1B"],
            "infra.nproc_per_node=4",
        ),
        "ddp_ep2 x Interleaved1F1B": (["parallel=[ddp_ep,pp]", "parallel.ddp_ep.degree=2"], "infra.nproc_per_node=4"),
    }
    for name in variants:
        copy_as_of(ref, tmp_path / name, 2)
    for name, (parallel, extra) in variants.items():
        got, got_eval = train(tmp_path / name, *parallel, extra)
        assert got[2:] == pytest.approx(want[2:], rel=2e-5), name
        assert got_eval == pytest.approx(want_eval, rel=2e-5), name
    # Back to one process from the pipeline's own checkpoint (written by 2 stages).
    back = tmp_path / "back"
    copy_as_of(tmp_path / "ddp x ulysses 2 x 1F1B", back, 4)
    assert train(back, *one)[0][4:] == pytest.approx(want[4:], rel=2e-5)
