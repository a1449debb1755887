"""Data mixtures (``data.sources``): OLMo-core's source mixture samples each source by its weight
(the plan says how many tokens and epochs), held-out sequences stay out of every source, the
override syntax works from the CLI, and bad mixtures are refused naming the field."""

from __future__ import annotations

import re

import numpy as np
import pytest

from olmx.errors import ConfigError
from tests.conftest import olmx_cli
from tests.test_training import SMALL as TINY_RUN
from tests.worker.test_eval import NUMPY, SEQ, plan_of

BIG, LITTLE = 0, 30000  # first ids of the two sources: an id says which source it came from


def source_file(path, first: int, sequences: int):
    np.arange(first, first + sequences * SEQ, dtype=np.uint16).tofile(path)
    return path


def test_two_sources_are_sampled_by_weight_and_the_plan_says_so(tmp_path) -> None:
    from olmx.worker.datasets import build_train_dataset, data_split, write_holdout

    big = source_file(tmp_path / "big.u16", BIG, 400)
    small = source_file(tmp_path / "small.u16", LITTLE, 4)
    sources = [f"data.sources.big.paths=[{big}]", "data.sources.big.weight=0.9"]
    sources += [f"data.sources.small.paths=[{small}]", "data.sources.small.weight=0.1"]
    # 50 steps x 4 sequences x 16 tokens = 3,200 tokens; 10 held out: 9 of big, 1 of small.
    plan = plan_of(tmp_path, *NUMPY, *sources, "trainer.max_steps=50", "eval.holdout_sequences=10")
    rows = dict(plan.sections["data"])
    assert rows["mixture"].startswith("2 sources, 3,200 tokens over the run")
    assert "(391 sequences to train on, 9 held out), weight 0.9 = 90.0%: ~2,880 tokens" in rows["source big"]
    assert "0.46 epochs" in rows["source big"] and "REPEATED" not in rows["source big"]
    assert "(3 sequences to train on, 1 held out), weight 0.1 = 10.0%: ~320 tokens" in rows["source small"]
    assert re.search(r"= 6\.67 epochs -- REPEATED: each of its tokens is trained on 6\.67 times", rows["source small"])
    assert rows["held out"].endswith("(big 9, small 1), never trained on")

    splits = data_split(plan)
    dataset = build_train_dataset(plan, splits, tmp_path / "work")
    dataset.prepare()
    firsts = np.array([int(dataset[i]["input_ids"][0]) for i in range(len(dataset))])
    assert len(firsts) * SEQ == 3200  # exactly the run's tokens: one epoch is the run
    from_small = (firsts >= LITTLE).sum() * SEQ
    assert from_small / 3200 == pytest.approx(0.1, abs=SEQ / 3200)  # the weight, within one sequence
    assert from_small == 320 and (firsts < LITTLE).sum() * SEQ == 2880  # the plan's numbers
    held = np.fromfile(write_holdout(splits, plan), dtype=np.uint16)[::SEQ].astype(int)
    assert sorted(held) == [BIG + s * SEQ for s in range(391, 400)] + [LITTLE + 3 * SEQ]
    assert not set(held) & set(firsts.tolist())  # neither source trains on its held-out sequences


def test_the_override_syntax_works_from_the_cli_and_writes_nothing(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    for i in range(3):
        (tmp_path / "a" / f"{i}.txt").write_text(f"alpha {i} " * 400)
    (tmp_path / "b.md").write_text("# beta\n" * 600)
    proc = olmx_cli(
        "train",
        "--dry-run",
        *TINY_RUN,
        f"trainer.run_dir={tmp_path / 'run'}",
        "data=text",
        f"data.sources.alpha.paths=[{tmp_path}/a/*.txt]",
        "data.sources.alpha.weight=3",
        f"data.sources.beta.paths=[{tmp_path / 'b.md'}]",
        env={"OLMX_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "paths: - " + str(tmp_path / "a") in out and "weight: 3.0" in out  # the resolved config
    assert "source alpha" in out and "weight 3 = 75.0%" in out and "weight 1 = 25.0%" in out  # the plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b.md"]  # nothing written, no cache
    typo = olmx_cli(
        "train",
        "--dry-run",
        "data=text",
        f"data.sources.beta.paths=[{tmp_path / 'b.md'}]",
        "data.sources.beta.wieght=2",
    )
    assert typo.returncode == 2 and "data.sources.beta.wieght" in typo.stderr and "Traceback" not in typo.stderr


@pytest.mark.parametrize(
    ("overrides", "field", "match"),
    [
        (["data.paths=[{big}]"], "data.sources", "set data.paths or data.sources, not both"),
        (["data.sources.small.weight=0"], "data.sources.small.weight", "positive finite number"),
        (["data.sources.small.paths=[]"], "data.sources.small.paths", "needs at least one file"),
        (["data.sources.small.paths=[{big}]"], "data.sources.small.paths", "also in data.sources.big.paths"),
        (["data.sources.small.paths=[{tmp}/nope.u16]"], "data.sources.small.paths", "does not exist"),
        (["eval.holdout_sequences=200"], "data.sources.small.paths", "all held out for evaluation"),
        (["data.sources.small=5"], "data.sources.small", "expected a section of keys"),
        (["data.sources=5"], "data.sources", "expected named sources"),
    ],
)
def test_bad_mixtures_name_their_field(tmp_path, overrides, field, match) -> None:
    big = source_file(tmp_path / "big.u16", BIG, 400)
    small = source_file(tmp_path / "small.u16", LITTLE, 4)
    base = [f"data.sources.big.paths=[{big}]", f"data.sources.small.paths=[{small}]"]
    with pytest.raises(ConfigError, match=match) as info:
        plan_of(tmp_path, *NUMPY, *base, *(o.format(big=big, tmp=tmp_path) for o in overrides))
    assert info.value.field == field


def test_a_mixture_needs_files_of_its_own(tmp_path) -> None:
    with pytest.raises(ConfigError, match="data=stdlib is one built-in corpus") as info:
        plan_of(tmp_path, f"data.sources.a.paths=[{tmp_path}/x.txt]")
    assert info.value.field == "data.sources"
