"""Held-out evaluation: the slice is never trained on, the plan checks it, and a 2-process Engram
run on a two-source mixture, resumed half-way, has ``eval/loss`` equal to the loss of its
checkpoint on the held-out sequences computed in one process with plain torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli
from tests.test_training import SMALL, train

SEQ = 16


def plan_of(tmp_path: Path, *overrides: str):
    reg = registry()
    base = [
        "infra.nproc_per_node=1",
        "parallel=[]",
        f"data.seq_len={SEQ}",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
        f"trainer.run_dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    return plan_from_overrides([*base, *overrides], reg)


def positional_files(tmp_path: Path, sizes: list[int]) -> list[Path]:
    """Raw uint16 token files whose ids are their global positions: an id says where it came from."""
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = tmp_path / f"part{i}.u16"
        np.arange(start, start + n, dtype=np.uint16).tofile(path)
        paths.append(path)
        start += n
    return paths


NUMPY = ["data=numpy", "data.tokenizer.vocab_size=65536", "data.tokenizer.eos_id=65534", "data.tokenizer.pad_id=65535"]


@pytest.mark.parametrize("held", [8, 34])
def test_the_held_out_slice_is_never_in_the_training_dataset(tmp_path, held) -> None:
    from olmx.worker.datasets import build_train_dataset, data_split, write_holdout

    # 40 and 30 whole sequences (+7 tokens OLMo-core drops); 34 held out spill into the first file.
    files = positional_files(tmp_path, [40 * SEQ, 30 * SEQ + 7])
    plan = plan_of(tmp_path, *NUMPY, f"data.paths=[{files[0]},{files[1]}]", f"eval.holdout_sequences={held}")
    rows = dict(plan.sections["data"])
    assert rows["held out"].startswith(f"{held} sequences x {SEQ} tokens")
    splits = data_split(plan)
    dataset = build_train_dataset(plan, splits, tmp_path / "work")
    dataset.prepare()
    trained = {int(dataset[i]["input_ids"][0]) // SEQ for i in range(len(dataset))}
    assert all(int(dataset[i]["input_ids"][0]) % SEQ == 0 for i in range(len(dataset)))  # whole sequences
    ids = np.fromfile(write_holdout(splits, plan), dtype=np.uint16)
    assert len(ids) == held * SEQ and (np.diff(ids.astype(int)) == 1).sum() >= len(ids) - 2
    evaluated = {int(s) // SEQ for s in ids[::SEQ]}
    # Sequences are numbered 0-69 over both files; the last `held` of them are held out.
    assert evaluated == set(range(70 - held, 70))
    assert trained == set(range(70 - held)) and not trained & evaluated


#: Four DDP ranks of one sequence per micro-batch (planned only).
FOUR_RANKS = ["infra.nproc_per_node=4", "parallel=[ddp]", "trainer.micro_batch_size=1"]


def test_the_default_holds_out_32_sequences_or_says_why_it_cannot(tmp_path) -> None:
    files = positional_files(tmp_path, [40 * SEQ, 30 * SEQ])
    rows = dict(plan_of(tmp_path, *NUMPY, f"data.paths=[{files[0]},{files[1]}]").sections["data"])
    assert rows["held out"].startswith(f"32 sequences x {SEQ} tokens")
    # 34 sequences cannot spare 32 and still fill a 4-sequence step: no evaluation, and why.
    (tmp_path / "s").mkdir()
    small = plan_of(tmp_path, *NUMPY, f"data.paths=[{positional_files(tmp_path / 's', [34 * SEQ])[0]}]")
    assert small.run.eval.interval == 0 and "held out" not in dict(small.sections["data"])
    assert "cannot spare 32 to hold out" in dict(small.sections["data"])["evaluation"]
    # Fewer held-out sequences than one micro-batch per rank: smaller evaluation batches.
    six = plan_of(tmp_path, *NUMPY, f"data.paths=[{files[0]}]", *FOUR_RANKS, "eval.holdout_sequences=6")
    assert "of 4 sequences of the held-out slice (1 batch(es) of 4)" in dict(six.sections["data"])["evaluation"]


@pytest.mark.parametrize(
    ("overrides", "field", "match"),
    [
        (["eval.interval=-5"], "eval.interval", "must be an integer >= 0 or null, got -5"),
        (["eval.holdout_sequences=0"], "eval.holdout_sequences", "must be a positive integer or null, got 0"),
        (FOUR_RANKS + ["eval.holdout_sequences=2"], "eval.holdout_sequences", "fewer than the 4 data-parallel ranks"),
        (FOUR_RANKS + ["eval.max_sequences=3"], "eval.max_sequences", r"less than one sequence per data-parallel rank"),
        (["eval.holdout_sequences=68"], "eval.holdout_sequences", "leaves 2, less than one optimizer step"),
        (["eval.data=[/nonexistent/x.txt]"], "eval.data", "does not exist"),
    ],
)
def test_bad_eval_settings_name_their_field(tmp_path, overrides, field, match) -> None:
    files = positional_files(tmp_path, [40 * SEQ, 30 * SEQ])
    with pytest.raises(ConfigError, match=match) as info:
        plan_of(tmp_path, *NUMPY, f"data.paths=[{files[0]},{files[1]}]", *overrides)
    assert info.value.field == field


def test_eval_off_holds_nothing_out_and_eval_data_is_read_instead(tmp_path) -> None:
    files = positional_files(tmp_path, [40 * SEQ, 30 * SEQ])
    data = f"data.paths=[{files[0]}]"
    off = plan_of(tmp_path, *NUMPY, data, "eval.interval=0")
    assert dict(off.sections["data"])["evaluation"] == "off (eval.interval)"
    other = plan_of(tmp_path, *NUMPY, data, f"eval.data=[{files[1]}]", "eval.max_sequences=9")
    rows = dict(other.sections["data"])
    assert "held out" not in rows
    assert rows["evaluation"] == (
        "every 50 steps and at step 200: loss and perplexity of 8 sequences of eval.data (2 batch(es) of 4)"
    )


def test_two_process_engram_eval_survives_a_resume_and_equals_one_process_torch(tmp_path) -> None:
    import torch
    import torch.nn.functional as F

    from olmx.local_model import choose_checkpoint, load_model, one_process
    from olmx.plan import Plan
    from olmx.plan.resolve import local_plan
    from olmx.worker.datasets import data_split, write_holdout

    # A two-source mixture (OLMo-core's source mixture in a real run; tests/data/test_mixture.py checks
    # its proportions): the held-out slice comes from both sources.
    (tmp_path / "squares.txt").write_text("".join(f"{i} squared is {i * i}; " for i in range(3000)))
    (tmp_path / "cubes.txt").write_text("".join(f"{i} cubed is {i**3}; " for i in range(1500)))
    run, cache = tmp_path / "run", {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    common = ["data=text", f"data.sources.squares.paths=[{tmp_path / 'squares.txt'}]", "data.sources.squares.weight=3"]
    common += [f"data.sources.cubes.paths=[{tmp_path / 'cubes.txt'}]", "trainer.max_steps=8", "eval.interval=4"]
    common += ["layers=[engram]", "layers.engram.layer_ids=[1]", "layers.engram.n_embed_per_ngram=64"]
    common += [f"data.cache_dir={tmp_path / 'cache'}"]
    first = train(run, cache, *common, "trainer.stop_at_step=4")
    assert [r["step"] for r in first if "eval/loss" in r] == [4]
    # The held-out slice is cut from the training data: resuming with another one is refused.
    other = olmx_cli(
        "train",
        "--dry-run",
        *SMALL,
        f"trainer.run_dir={run}",
        *common,
        "eval.holdout_sequences=16",
        env=cache,
    )
    assert other.returncode == 2 and "held out of the training data for evaluation" in other.stderr
    assert "32 -> 16" in other.stderr and "Traceback" not in other.stderr
    resumed = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *common, env=cache)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))  # no step twice
    evals = {r["step"]: r for r in records if "eval/loss" in r}
    assert list(evals) == [4, 8]
    # The progress lines (stderr) show the evaluation of the resumed part.
    assert f"step 8/8 (100%), loss {records[-1]['loss']:.3f}, eval loss {evals[8]['eval/loss']:.3f}" in resumed.stderr
    assert evals[8]["eval/loss"] < evals[4]["eval/loss"] < records[0]["loss"]  # it learns, held out too
    assert evals[8]["eval/perplexity"] == pytest.approx(math.exp(evals[8]["eval/loss"]), rel=1e-6)

    reg = registry()
    plan = local_plan(run, reg)
    with one_process(plan):
        model = load_model(plan, reg, choose_checkpoint(run, 8))
        saved = Plan.load(run / "plan.yaml", reg)
        held = np.fromfile(write_holdout(data_split(saved), saved), dtype=np.uint16).reshape(-1, saved.batch.seq_len)
        x = torch.from_numpy(held.astype(np.int64))
        model.eval()
        with torch.no_grad():
            logits = model(x)
        reference = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()
    assert len(held) == 32  # eval.holdout_sequences, all evaluated (4 batches of 4 x 2 ranks)
    assert evals[8]["eval/loss"] == pytest.approx(reference, rel=1e-5)
