"""``trainer.activation_checkpointing=budget`` (OLMo-core's ``mode=budget``, OLMo 3 32B's script):
torch.compile's min-cut partitioner keeps at most ``trainer.activation_memory_budget`` of what a
compiled block keeps and recomputes the rest. The plan's two terms for it are checked against
what the partitioner really does to an OLMo-core block compiled on CPU, counted as
``benchmarks/compiled_activations.py`` counts them (its ``measure_budget``): the bytes autograd
saves (saved-tensor hooks) and the matmul FLOPs of the backward graph beyond twice the forward's
(the recompute)."""

from __future__ import annotations

import pytest

from olmx.errors import ConfigError
from olmx.plan.memory import budget_block_activations
from tests.conftest import script_module


def test_the_budget_terms_bound_what_the_partitioner_keeps_and_recomputes() -> None:
    bench = script_module("benchmarks/compiled_activations.py", "compiled_activations")
    # OLMo 3 32B's width ratios (feed-forward 5.4 d, 5 query heads of 64 a kv head), 2 x 128 tokens
    case = bench.Case("32B ratios", 320, 5, 1, 1728)
    everything = bench.measure_budget(case, 1.0, seq=128)
    assert everything["recomputed_matmul_share"] == 0 and not everything["attention_recomputed"]
    for budget in (0.5, 0.3):
        r = bench.measure_budget(case, budget, seq=128)
        planned = budget_block_activations(everything["kept"], case.d * 2, budget)
        # whole tensors: 0.79-1.07x the share (benchmarks/results/memory_model.md), well under none
        assert 0.75 * planned <= r["kept"] <= 1.08 * planned, (budget, r["kept"], planned)
        assert r["kept"] < 0.7 * everything["kept"]
        # the plan's matmul share bounds what was recomputed (the plan adds the attention's forward)
        assert 0 < r["recomputed_matmul_share"] <= r["model_recompute_share"], r
        assert r["attention_recomputed"]


def test_budget_needs_a_compiled_run(tmp_path) -> None:
    """On CPUs nothing is compiled (OLMo-core compiles only with CUDA): budget is refused at
    plan time, naming the modes that work; on GPUs the plan counts its recompute."""
    from olmx.planning import plan_run

    with pytest.raises(ConfigError, match="budget needs torch.compile") as info:
        plan_run([f"trainer.run_dir={tmp_path / 'a'}", "trainer.activation_checkpointing=budget"])
    assert info.value.field == "trainer.activation_checkpointing" and "long_context, full or auto" in str(info.value)
    gpu = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.ship_data=false", "infra.gpus_per_node=8"]
    gpu += ["model=olmo3_1b", "data.seq_len=8192", "trainer.global_batch_size=8", "trainer.micro_batch_size=1"]
    none = plan_run([f"trainer.run_dir={tmp_path / 'b'}", *gpu])
    half = plan_run([f"trainer.run_dir={tmp_path / 'c'}", *gpu, "trainer.activation_checkpointing=budget"])
    assert half.execution.compile
    flops = dict(half.sections["time"])["FLOPs per token"]
    assert "(activation_checkpointing=budget, trainer.activation_memory_budget=0.5)" in flops
    assert "+ recompute" not in dict(none.sections["time"])["FLOPs per token"]
    peak_none, peak_half = (float(dict(p.sections["memory"])["estimated peak"].split()[0]) for p in (none, half))
    assert peak_half < peak_none
