"""Resolution of a run into a plan: batch geometry, parameter counts, run dir, resume."""

from __future__ import annotations

from datetime import datetime

from olmx.data.files import byte_corpus_tokens, cache_dir, stdlib_files
from olmx.plan import Plan
from olmx.plan.resolve import padded_vocab, plan_from_overrides
from olmx.registry import registry
from olmx.rundir import RunDir


def plan_for(*overrides: str) -> Plan:
    reg = registry()
    return plan_from_overrides(list(overrides), reg, now=datetime(2026, 1, 2, 3, 4, 5))


def test_default_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_for()
    assert plan.world.size == 2 and plan.world.device == "cpu"
    assert plan.mesh.dims() == {"dp": 2}
    assert (plan.batch.global_seqs, plan.batch.micro_seqs, plan.batch.dp_ranks, plan.batch.grad_accum) == (16, 8, 2, 1)
    assert plan.batch.global_tokens == 16 * 256 and plan.vocab_size == 384
    assert plan.run_dir == str(tmp_path / "runs" / "20260102-030405-tiny")
    assert plan.resume_step is None
    files = stdlib_files()
    corpus = byte_corpus_tokens(files)  # one id per byte, one end-of-document id per file
    assert dict(plan.sections["data"]) == {
        "corpus": f"{len(files):,} file(s), {corpus:,} byte-level tokens, cached in {cache_dir(plan.run.data)}",
        "sequences": f"{corpus // 256:,} x 256 tokens = {corpus // 256 // 16:,} steps per epoch",
        # eval is on by default: 32 sequences held out, evaluated in batches of 8 x 2 ranks
        "evaluation": "every 50 steps and at step 200: loss and perplexity of 32 sequences of the held-out "
        "slice (2 batch(es) of 16)",
        "held out": "32 sequences x 256 tokens = 8,192 tokens from the end of the training data, never trained on",
    }
    assert "warnings" not in plan.sections  # 20 warm-up steps in a 200-step run
    assert list(tmp_path.iterdir()) == []


def test_gradient_accumulation_and_single_process():
    plan = plan_for(
        "infra.nproc_per_node=1", "parallel=[]", "trainer.global_batch_size=32", "trainer.micro_batch_size=4"
    )
    assert plan.world.size == 1 and plan.batch.dp_ranks == 1 and plan.batch.grad_accum == 8
    assert plan.mesh.dims() == {"dp": 1}


def test_padded_vocab():
    assert [padded_vocab(v) for v in (258, 384, 385, 100278)] == [384, 384, 512, 100352]


def test_resume_step_is_the_newest_complete_checkpoint(tmp_path):
    run = tmp_path / "run"
    for step, complete in ((10, True), (20, True), (30, False)):
        d = run / "checkpoints" / f"step{step}"
        d.mkdir(parents=True)
        if complete:
            (d / ".metadata.json").write_text("{}")
    assert RunDir(run).latest_checkpoint() == 20
    RunDir(run).claim()  # olmx's marker: a folder of someone else's would be refused
    assert plan_for(f"trainer.run_dir={run}").resume_step == 20
    assert plan_for(f"trainer.run_dir={run}", "trainer.resume=false").resume_step is None


def test_plan_round_trips_through_yaml(tmp_path):
    plan = plan_for(f"trainer.run_dir={tmp_path / 'r'}", "parallel=[fsdp]", "precision=bf16")
    path = plan.save()
    assert path == tmp_path / "r" / "plan.yaml"
    assert Plan.load(path) == plan
    assert plan.sections["precision"][1] == ("compute (all-gathered parameters)", "bfloat16")
    # a plugin's decisions come back as its Decisions dataclass, as its config does
    from olmx_plugins.layers.moe.config import MoEDecisions

    moe = plan_for(f"trainer.run_dir={tmp_path / 'm'}", "layers=[moe]")
    loaded = Plan.load(moe.save())
    assert loaded.decisions == {"layers.moe": MoEDecisions(backend="portable")} == moe.decisions
