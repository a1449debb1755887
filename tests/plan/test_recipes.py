"""``experiment=olmo3_7b`` and ``experiment=olmo3_32b`` are OLMo-core 3's official stage-1
pre-training scripts, field for field.

Each test builds OLMo-core's config objects the way the script does
(``src/scripts/official/OLMo3/OLMo-3-1025-7B-pretrain-1.py`` and ``OLMo-3-1025-32B-pretrain.py``
in allenai/OLMo-core: the model, the tokenizer, the dataset's filter, the data loader, the train
module, the trainer's intervals and duration, the evaluators' tasks and intervals), plans the
recipe as ``olmx train experiment=NAME data.paths=[...]`` does on Slurm nodes of 8 H100s (the
user gives only the data and the infra), builds OLMo-core's configs from the plan with the
worker's own functions, and compares every field. Where olmx deliberately does a thing
differently, the comparison names it (:data:`DIFFERENCES`) and checks olmx's equivalent.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: What the scripts set that olmx does another way, each checked below by its equivalent.
DIFFERENCES = {
    "train_module.max_grad_norm": "olmx's guard clips by the global norm across device meshes (trainer.max_grad_norm)",
    "train_module.float8_config": "Float8Config(enabled=False) is precision=bf16 (no float8_config)",
    "train_module.dp_config.shard_degree/num_replicas": "pinned to the plan's mesh, which is OLMo-core's default",
    "trainer.max_duration": "trainer.max_tokens / trainer.epochs become trainer.max_steps at plan time",
}

#: The "fast" downstream task set both scripts evaluate.
FAST_TASKS = sorted(
    [
        "arc_challenge_test_bpb_5shot",
        "arc_challenge_test_mc_5shot_fast",
        "arc_easy_test_bpb_5shot",
        "arc_easy_test_mc_5shot_fast",
        "hellaswag_bpb_5shot",
        "mmlu_humanities_test_bpb_5shot",
        "mmlu_humanities_test_mc_5shot_fast",
        "mmlu_other_test_bpb_5shot",
        "mmlu_other_test_mc_5shot_fast",
        "mmlu_social_sciences_test_bpb_5shot",
        "mmlu_social_sciences_test_mc_5shot_fast",
        "mmlu_stem_test_bpb_5shot",
        "mmlu_stem_test_mc_5shot_fast",
        "basic_skills_arithmetic_rc_5shot",
        "basic_skills_coding_rc_5shot",
        "basic_skills_common_knowledge_rc_5shot",
        "basic_skills_logical_reasoning_rc_5shot",
        "basic_skills_pattern_rc_5shot",
        "basic_skills_string_operations_rc_5shot",
        "codex_humaneval_gold_bpb_3shot",
        "codex_mbpp_gold_bpb_3shot",
        "minerva_math_500_gold_bpb_0shot",
        "mt_mbpp_cpp_gold_bpb_3shot",
        "mt_mbpp_java_gold_bpb_3shot",
        "mt_mbpp_rust_gold_bpb_3shot",
        "copycolors_10way_fast",
    ]
)


def script(name: str) -> dict[str, Any]:
    """OLMo-core's configs as the official script builds them (its values, its constructors)."""
    from olmo_core.config import DType
    from olmo_core.data import InstanceFilterConfig, NumpyDataLoaderConfig, TokenizerConfig
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.float8 import Float8Config
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.transformer import TransformerActivationCheckpointingMode, TransformerConfig
    from olmo_core.optim import CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train import Duration
    from olmo_core.train.train_module import (
        TransformerActivationCheckpointingConfig,
        TransformerDataParallelConfig,
        TransformerDataParallelWrappingStrategy,
        TransformerTrainModuleConfig,
    )

    seq = 8192
    tokenizer = TokenizerConfig.dolma2()
    if name == "olmo3_7b":
        build, global_tokens, lr, micro = TransformerConfig.olmo3_7B, 8192 * 512, 3e-4, 2 * 8192
        dp_extra: dict[str, Any] = {"wrapping_strategy": TransformerDataParallelWrappingStrategy.blocks}
        extra: dict[str, Any] = {}  # no activation checkpointing
        duration, hard_stop, metrics, evals = Duration.tokens(int(5e12)), Duration.steps(597046), 10, 10_000
        instance_filter = None
    else:
        build, global_tokens, lr, micro = TransformerConfig.olmo3_32B, 8 * 1024 * 1024, 6e-4, seq
        dp_extra = {"wrapping_strategy": TransformerDataParallelWrappingStrategy.full, "shard_degree": 64}
        extra = {
            "ac_config": TransformerActivationCheckpointingConfig(
                mode=TransformerActivationCheckpointingMode.budget, activation_memory_budget=0.5
            )
        }
        duration, hard_stop, metrics, evals = Duration.epochs(1), None, 50, 1000
        instance_filter = InstanceFilterConfig(
            repetition_max_period=13, repetition_min_period=1, repetition_max_count=32
        )
    model = build(vocab_size=tokenizer.padded_vocab_size(), attn_backend=AttentionBackendName.flash_2)
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=micro,
        max_sequence_length=seq,
        optim=SkipStepAdamWConfig(
            lr=lr,
            weight_decay=0.1,
            betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
        ),
        scheduler=CosWithWarmup(warmup_steps=2000),
        compile_model=True,
        dp_config=TransformerDataParallelConfig(
            name=DataParallelType.hsdp, param_dtype=DType.bfloat16, reduce_dtype=DType.float32, **dp_extra
        ),
        float8_config=Float8Config(enabled=False),
        z_loss_multiplier=1e-5,
        max_grad_norm=1.0,
        **extra,
    )
    return {
        "tokenizer": tokenizer,
        "model": model,
        "train_module": train_module,
        "data_loader": NumpyDataLoaderConfig(global_batch_size=global_tokens, seed=34521, num_workers=8),
        "seq_len": seq,
        "instance_filter": instance_filter,
        "duration": duration,
        "hard_stop": hard_stop,
        "metrics_collect_interval": metrics,
        "save_interval": 1000,
        "save_async": False,
        "eval_interval": evals,
        "tasks": FAST_TASKS,
    }


def _data(tmp_path: Path, sequences: int) -> str:
    """A dolma2-id token file of ``sequences`` sequences of 8,192 tokens (raw uint32, as OLMo's mix)."""
    path = tmp_path / "part-0.npy"
    ids = np.random.default_rng(0).integers(0, 100_000, size=sequences * 8192, dtype=np.uint32)
    ids[::997] = 100257
    ids.tofile(path)
    return str(path)


GPU = "infra.gpu_name='NVIDIA H100 80GB HBM3'"


def _plan(name: str, data: str, nodes: int, *extra: str) -> Any:
    from olmx.planning import plan_run

    return plan_run(
        [
            f"experiment={name}",
            f"data.paths=[{data}]",
            "infra=slurm",
            f"infra.nodes={nodes}",
            "infra.gpus_per_node=8",
            GPU,
            # the fast set is checked against the recipe below; planning it tokenizes every task
            # with dolma2's tokenizer.json, which is not on a test machine
            "eval.downstream=[]",
            *extra,
        ]
    )


def _fields(config: Any) -> dict[str, Any]:
    """An OLMo-core config's fields as plain values."""
    return config.as_dict(recurse=True) if hasattr(config, "as_dict") else dict(vars(config))


def _differ(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


@pytest.mark.parametrize(("name", "nodes", "sequences"), [("olmo3_7b", 1, 1100), ("olmo3_32b", 8, 2100)])
def test_recipe_is_the_official_script(tmp_path: Path, name: str, nodes: int, sequences: int) -> None:
    from olmo_core.distributed.parallel import DataParallelType

    from olmx.registry import registry
    from olmx.worker.datasets import instance_filter_config
    from olmx.worker.model import build_model_config
    from olmx.worker.train import train_module_config

    ref = script(name)
    plan = _plan(name, _data(tmp_path, sequences), nodes)
    run = plan.run

    # the tokenizer's ids and the model's padded vocabulary
    tok = run.data.tokenizer
    assert (tok.name, tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id) == (
        "dolma2",
        ref["tokenizer"].vocab_size,
        ref["tokenizer"].eos_token_id,
        ref["tokenizer"].pad_token_id,
        ref["tokenizer"].bos_token_id,
    )
    assert plan.vocab_size == ref["tokenizer"].padded_vocab_size() == 100352

    # the model: OLMo-core's own builder, every field
    model = build_model_config(
        run.model,
        vocab_size=plan.vocab_size,
        attention=plan.execution.attention,
        seq_len=plan.batch.seq_len,
        init_seed=run.trainer.seed,
    )
    assert _differ(_fields(model), _fields(ref["model"])) == {}

    # the train module, every field but the documented differences
    ours = train_module_config(plan, registry())
    theirs = ref["train_module"]
    assert plan.execution.compile is True
    mine, official = _fields(ours), _fields(theirs)
    for key in ("max_grad_norm", "float8_config", "dp_config"):
        mine.pop(key), official.pop(key)
    assert _differ(mine, official) == {}
    assert run.trainer.max_grad_norm == theirs.max_grad_norm == 1.0  # olmx's guard clips
    assert ours.float8_config is None and not theirs.float8_config.enabled
    dp_mine, dp_official = _fields(ours.dp_config), _fields(theirs.dp_config)
    replicas_shard = (dp_mine.pop("num_replicas"), dp_mine.pop("shard_degree"))
    dp_official.pop("num_replicas"), dp_official.pop("shard_degree")
    assert _differ(dp_mine, dp_official) == {}
    assert ours.dp_config.name == DataParallelType.hsdp
    world = nodes * 8
    # OLMo-core's default: one replica per node, a node's GPUs shard; the 32B script: 64 shards
    expected = (world // 64, 64) if theirs.dp_config.shard_degree else (nodes, world // nodes)
    assert replicas_shard == expected

    # the data: sequence length, the repetition filter, the loader's batch, seed and workers
    assert plan.batch.seq_len == ref["seq_len"]
    assert instance_filter_config(run.data.instance_filter) == ref["instance_filter"]
    loader = ref["data_loader"]
    assert (plan.batch.global_tokens, run.data_seed, run.data.num_workers) == (
        loader.global_batch_size,
        loader.seed,
        loader.num_workers,
    )

    # the trainer: intervals, checkpoints, duration
    assert plan.execution.log_interval == ref["metrics_collect_interval"]
    assert run.trainer.save_interval == ref["save_interval"]
    duration = ref["duration"]
    if duration.unit.value == "tokens":
        assert run.trainer.max_steps == math.ceil(duration.value / loader.global_batch_size) == 1_192_093
        assert run.trainer.stop_at_step == ref["hard_stop"].value
    else:  # one epoch: every whole training sequence once, in whole optimizer steps
        held = run.eval.holdout_sequences or 0
        assert run.trainer.max_steps == duration.value * (sequences - held) // run.trainer.global_batch_size
        assert run.trainer.stop_at_step is None
    assert "duration" in dict(plan.sections["data"])

    # evaluation: the interval and the "fast" downstream set, as the recipe lists it
    assert run.eval.interval == ref["eval_interval"]
    from olmx.config.compose import compose, to_object

    recipe = to_object(compose([f"experiment={name}", f"data.paths=[{tmp_path}/x.npy]"], registry()), registry())
    assert sorted(recipe.eval.downstream) == ref["tasks"]
    assert set(ref["tasks"]) <= set(_task_names())


def _task_names() -> list[str]:
    from olmx.plan.downstream import task_names

    return task_names()


def test_the_recipes_layout_on_its_sources_gpu_is_warned_not_refused(tmp_path: Path) -> None:
    """olmx's estimate of the 7B script's layout (micro-batch 2, no checkpointing) exceeds an
    H100; the script trains it on H100s, so the plan warns. Any other layout is held to the
    estimate: a larger micro-batch or another strategy is refused."""
    from olmx.errors import ConfigError

    data = _data(tmp_path, 1100)
    plan = _plan("olmo3_7b", data, 1)
    warning = dict(plan.sections["warnings"])["memory"]
    assert "more than the 73.7 GiB usable" in warning
    assert "Not refused: OLMo-core's OLMo-3-1025-7B-pretrain-1.py trains this layout" in warning
    for other in (["trainer.micro_batch_size=4"], ["parallel=[fsdp]"]):
        with pytest.raises(ConfigError) as info:
            _plan("olmo3_7b", data, 1, *other)
        assert info.value.field == "memory"


@pytest.mark.parametrize(
    ("name", "nodes", "sequences"), [("olmo3_7b", 1, 1100), ("olmo3_7b", 64, 1100), ("olmo3_32b", 128, 2100)]
)
def test_auto_is_no_worse_than_the_scripts_layout(tmp_path: Path, name: str, nodes: int, sequences: int) -> None:
    """The expert check at the published cluster shapes (7B on 1 and 64 nodes of 8 H100s, 32B on
    128): ``parallel=auto`` lays the recipe out so that its estimated peak and step time are no
    worse than those of the layout OLMo-core's script uses, shown beside it in the plan; where
    the plan refuses the script's layout (the 7B's micro-batch of 2 at 512 GPUs and 512
    sequences), it says why. The 32B's script checkpoints activations under a memory budget of
    0.5 (``mode=budget``): auto takes the same budget on fully sharded parameters."""
    import re

    plan = _plan(name, _data(tmp_path, sequences), nodes, "parallel=auto")
    rows = dict(plan.sections["auto"])
    ours = rows["auto's layout"]
    theirs = next(v for k, v in rows.items() if k.endswith("'s layout") and k != "auto's layout")
    assert "(fits)" in ours
    if nodes == 64:
        assert "refused here" in theirs and "trainer.micro_batch_size" in theirs and "beside it" not in rows
        return
    beside = re.fullmatch(r"peak ([\d.]+)x the recipe's, step time ([\d.]+)x(: .*)?", rows["beside it"])
    assert beside, rows["beside it"]
    assert float(beside[1]) <= 1.0 and float(beside[2]) <= 1.0, rows["beside it"]
    if name == "olmo3_32b":
        assert "trainer.activation_checkpointing=budget" in theirs
        assert plan.run.trainer.activation_checkpointing == "budget"
        assert plan.run.trainer.activation_memory_budget == 0.5
