"""The ``ulysses`` plan: mesh and batch geometry, the dry-run rows, every refusal, the
``long_context`` recipe and the ``trainer.activation_checkpointing`` modes (no processes)."""

from __future__ import annotations

from datetime import datetime

import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from olmx_plugins.parallel.ulysses import all_to_all_bytes


def plan_for(*overrides: str):
    reg = registry()
    return plan_from_overrides(list(overrides), reg, now=datetime(2026, 1, 2, 3, 4, 5))


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        plan_for(*overrides)
    return str(info.value)


def rows(plan) -> dict[str, str]:
    return dict(plan.sections["parallel.ulysses"])


def test_fsdp_ulysses_plan_shards_each_sequence_over_the_group():
    plan = plan_for("parallel=[fsdp,ulysses]", "parallel.ulysses.degree=2", "data.seq_len=8192")
    assert plan.mesh.dims() == {"dp": 1, "cp": 2}
    assert plan.batch.dp_ranks == 1 and plan.batch.grad_accum == 2  # 16 seqs, micro 8, 1 data rank
    r = rows(plan)
    assert r["tokens per rank"] == "8,192 / 2 = 4,096 per sequence, 32,768 per micro-batch of 8"
    assert r["heads per rank in attention"] == "2 of 4 query, 2 of 4 kv"
    # tiny model: 4 heads of 32 dims; fp32: 8 x 4096 tokens x 4 heads x 32 x 4 bytes = 16 MiB each
    assert r["all-to-all per layer"].startswith(
        "64.00 MiB per rank forward + the same backward "
        "(q 16.00 MiB, k 16.00 MiB, v 16.00 MiB, out 16.00 MiB; "
        "4-byte activations; 1/2 leaves the rank)"
    )
    assert r["all-to-all per micro-batch"] == "512.00 MiB per rank (4 layers, forward + backward)"


def test_two_data_by_two_sequence_ranks_and_hsdp():
    plan = plan_for("infra.nproc_per_node=4", "parallel=[ddp,ulysses]")
    assert plan.mesh.dims() == {"dp": 2, "cp": 2} and plan.batch.dp_ranks == 2
    assert rows(plan)["degree"] == "2 ranks per sequence, 2 sequence group(s)"
    plan = plan_for(
        "infra.nproc_per_node=8",
        "parallel=[hsdp,ulysses]",
        "parallel.hsdp.shard_degree=2",
        "trainer.micro_batch_size=4",
    )
    assert plan.mesh.dims() == {"dp_replicate": 2, "dp_shard": 2, "cp": 2}


def test_kv_heads_are_replicated_instead_of_refused():
    r = rows(plan_for("parallel=[fsdp,ulysses]", "model.n_kv_heads=1", "precision=bf16"))
    assert r["heads per rank in attention"] == "2 of 4 query, 1 of 2 kv (kv heads 1 replicated x2)"
    # bf16: 2-byte activations; k and v carry the replicated heads: 8 x 128 tokens x 2 x 32 x 2 bytes
    vol = all_to_all_bytes(micro_seqs=8, seq_len=256, n_heads=4, kv_heads=2, head_dim=32, degree=2, elem_bytes=2)
    assert vol == {"q": 262144, "k": 131072, "v": 131072, "out": 262144}
    assert "(q 0.25 MiB, k 0.12 MiB, v 0.12 MiB, out 0.25 MiB; 2-byte activations" in r["all-to-all per layer"]


def test_refusals_name_the_field_and_the_numbers():
    assert (
        refusal("parallel=[fsdp,ulysses]", "parallel.ulysses.degree=0")
        == "parallel.ulysses.degree: must be at least 1, got 0"
    )
    assert (
        refusal("parallel=[fsdp,ulysses]", "parallel.ulysses.degree=4")
        == "parallel.ulysses.degree: 4 must divide the world size 2 (1 node(s) x 2 processes)"
    )
    assert refusal("infra.nproc_per_node=3", "parallel=[ddp,ulysses]", "parallel.ulysses.degree=3") == (
        "parallel.ulysses.degree: 3 must divide model.n_heads=4: each rank attends with n_heads/degree heads"
    )
    assert refusal("parallel=[ddp,ulysses]", "data.seq_len=255").startswith(
        "data.seq_len: 255 must be divisible by parallel.ulysses.degree=2: each rank holds seq_len/degree tokens"
    )
    assert refusal("parallel=[ddp,ulysses]", "model.attn_backend=te", "model.n_kv_heads=1").startswith(
        "model.attn_backend: 'te' does its own Ulysses all-to-all and needs model.n_kv_heads=1 to be a multiple "
        "of parallel.ulysses.degree=2"
    )
    # Ulysses is not a data-parallel strategy: two processes still need one
    assert refusal("parallel=[ulysses]").startswith("parallel: cp=2 needs a data-parallel strategy beside it")


def test_long_context_recipe_resolves():
    # on 2 H100s (on this CPU, 27 GiB a process is more than its RAM share)
    h100s = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.gpus_per_node=2", "infra.ship_data=false"]
    plan = plan_for("experiment=long_context", *h100s)
    cfg = plan.run
    assert set(cfg.parallel) == {"fsdp", "ulysses"} and list(cfg.precision) == ["bf16"]
    assert cfg.trainer.activation_checkpointing == "long_context"
    assert cfg.model.name == "olmo3_1b" and cfg.data.seq_len == 32768
    assert plan.mesh.dims() == {"dp": 1, "cp": 2}
    r = rows(plan)
    assert r["tokens per rank"] == "32,768 / 2 = 16,384 per sequence, 16,384 per micro-batch of 1"
    # OLMo 3 1B: 16 heads of 128 dims; 16,384 tokens x 16 x 128 x 2 bytes = 64 MiB per tensor
    assert r["all-to-all per layer"].startswith("256.00 MiB per rank forward")


def test_activation_checkpointing_modes():
    from olmo_core.train.train_module import TransformerActivationCheckpointingMode as Mode

    from olmx.worker.train import LONG_CONTEXT_AC_MODULES, activation_checkpointing_config

    assert (
        refusal("trainer.activation_checkpointing=selected_ops")
        == "trainer.activation_checkpointing: 'selected_ops' is not one of full, budget, long_context, auto, null"
    )
    for mode in ("full", "long_context"):
        plan_for(f"trainer.activation_checkpointing={mode}")
    ac = activation_checkpointing_config("long_context")
    assert ac.mode == Mode.selected_modules and ac.modules == LONG_CONTEXT_AC_MODULES
    assert activation_checkpointing_config("full").mode == Mode.full
    budget = activation_checkpointing_config("budget", 0.3)
    assert budget.mode == Mode.budget and budget.activation_memory_budget == 0.3
