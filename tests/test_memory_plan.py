"""The plan's memory estimate: its terms, the GPU refusal with the cheapest change that fits,
the CPU warning, and device capacities. (Its accuracy against measured peaks is a benchmark:
``benchmarks/memory_model.py``, recorded in ``benchmarks/results/memory.md``.)"""

from __future__ import annotations

import dataclasses

import pytest

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError
from olmx.launch.devices import gpu_memory_gib
from olmx.plan import memory
from olmx.plan.resolve import resolve
from olmx.registry import registry

H100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3"]


def plan(tmp_path, *overrides: str):
    reg = registry()
    return resolve(to_object(compose([f"trainer.run_dir={tmp_path / 'run'}", *overrides], reg), reg), reg)


def _estimate(p):
    return memory.estimate(p.run, p.mesh, p.params.total, p.vocab_size, p.dtypes.param, p.world.device)


def test_a_7b_model_on_one_80gb_gpu_is_refused_with_the_numbers(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, *H100, "model=olmo3_7b")
    text = str(info.value)
    assert info.value.field == "memory"
    assert "is more than the 79.6 GiB of NVIDIA H100 80GB HBM3" in text
    assert "parameters 2" in text and "optimizer 4" in text  # ~6.5B float32 parameters: ~24 GiB, ~48 GiB
    assert not (tmp_path / "run").exists()


def test_the_suggested_change_is_one_the_plan_then_accepts(tmp_path) -> None:
    args = [*H100, "model=olmo3_1b", "data.seq_len=8192", "trainer.global_batch_size=16", "trainer.micro_batch_size=16"]
    with pytest.raises(ConfigError, match="cheapest change that fits: trainer.activation_checkpointing=full") as info:
        plan(tmp_path, *args)
    assert "(estimated " in str(info.value)
    fitted = plan(tmp_path, *args, "trainer.activation_checkpointing=full")
    rows = dict(fitted.sections["memory"])
    assert rows["estimated peak"].endswith("of 80 GiB per process (NVIDIA H100 80GB HBM3)")
    assert "without checkpointing" in rows["activations"]


def test_fsdp_shards_the_model_state_and_checkpointing_cuts_activations(tmp_path) -> None:
    gpus = [*H100, "infra.gpus_per_node=8", "model=olmo3_1b", "trainer.global_batch_size=64"]
    ddp, fsdp = _estimate(plan(tmp_path, *gpus)), _estimate(plan(tmp_path, *gpus, "parallel=[fsdp]"))
    assert ddp.params == 8 * fsdp.params and ddp.optimizer == 8 * fsdp.optimizer == 2 * 8 * fsdp.params
    assert ddp.activations == fsdp.activations
    full = _estimate(plan(tmp_path, *gpus, "parallel=[fsdp]", "trainer.activation_checkpointing=full"))
    assert full.activations < fsdp.activations / 4 and full.activations_no_ac == fsdp.activations
    longer = _estimate(plan(tmp_path, *gpus, "data.seq_len=4096", "trainer.micro_batch_size=4"))
    assert longer.activations > ddp.activations


def test_on_cpus_too_little_ram_is_a_warning_not_a_refusal(tmp_path) -> None:
    p = plan(tmp_path, "infra.nproc_per_node=1", "model=olmo3_1b")
    base = _estimate(p)
    small = dataclasses.replace(p.world, device_memory_gib=1.0)
    warnings = memory.check(base, p.run, p.mesh, small, p.params.total, p.vocab_size, p.dtypes.param)
    assert len(warnings) == 1 and f"estimated peak {memory.gib(base.peak)} per process" in warnings[0]
    assert (
        memory.check(
            base,
            p.run,
            p.mesh,
            dataclasses.replace(small, device_memory_gib=1e6),
            p.params.total,
            p.vocab_size,
            "float32",
        )
        == []
    )


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("NVIDIA H100 80GB HBM3", 79.6),
        ("NVIDIA A100-SXM4-40GB", 39.8),
        ("NVIDIA H200", 140.0),
        ("NVIDIA B200", 179.0),
        ("NVIDIA A40", 44.5),
        ("NVIDIA A100", None),  # 40 or 80 GB: unknown, so never refused
    ],
)
def test_gpu_memory_by_name(name: str, gib: float | None) -> None:
    assert gpu_memory_gib(name) == (pytest.approx(gib) if gib else None)


def test_more_cpu_processes_than_cores_is_a_plan_warning(tmp_path, monkeypatch) -> None:
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    crowded = plan(tmp_path, "infra.nproc_per_node=4", "trainer.global_batch_size=32")
    (row,) = [text for key, text in crowded.sections["warnings"] if key == "world"]
    assert row.startswith("4 CPU processes on 2 core(s)") and "infra.nproc_per_node=2" in row
    assert "warnings" not in plan(tmp_path, "infra.nproc_per_node=2").sections
    saved = crowded.save()
    from olmx.plan import Plan

    assert Plan.load(saved).world == crowded.world  # the world, warnings included, survives plan.yaml


def test_tables_and_experts_that_plugins_shard_count_once_per_rank(tmp_path) -> None:
    gpus = [*H100, "infra.gpus_per_node=8", "trainer.global_batch_size=64"]
    big = [
        "layers=[engram]",
        "layers.engram.vocab_size_per_ngram=[400000,400000]",
        "layers.engram.n_embed_per_ngram=512",
    ]
    backbone = plan(tmp_path, *gpus).params.total
    replicated = plan(tmp_path, *gpus, *big, "layers.engram.sharding=replicated")
    sharded = plan(tmp_path, *gpus, *big)  # auto: 1d, the tables' replicated state is over 1 GiB a rank
    assert dict(sharded.sections["layers.engram"])["sharding"].startswith("1d (auto")

    def gib(p) -> float:
        value, unit = dict(p.sections["memory"])["parameters"].split()[:2]
        return float(value) / (1024 if unit == "MiB" else 1)

    tables = replicated.params.total - backbone  # (and Engram's few dense weights)
    assert gib(replicated) == pytest.approx(4 * replicated.params.total / 2**30, abs=0.01)
    assert gib(sharded) == pytest.approx(4 * (backbone + tables / 8) / 2**30, rel=0.02)
    moe = ["layers=[moe]", "layers.moe.num_experts=8", "parallel=[ddp_ep]", "parallel.ddp_ep.degree=8"]
    ep, dense_ep = plan(tmp_path, *gpus, *moe), plan(tmp_path, *gpus, *moe[:2])
    assert gib(ep) < gib(dense_ep) / 2  # each rank holds 1 of the 8 experts of every MoE block


def test_ddp_on_eight_gpus_that_does_not_fit_is_told_to_shard(tmp_path) -> None:
    args = [
        *H100,
        "infra.gpus_per_node=8",
        "model=olmo3_7b",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=1",
    ]
    args += ["data.seq_len=512", "trainer.activation_checkpointing=full"]
    with pytest.raises(ConfigError, match=r"cheapest change that fits: parallel=\[fsdp\]"):
        plan(tmp_path, *args)
    fits = plan(tmp_path, *args, "parallel=[fsdp]")
    assert "of 80 GiB per process" in dict(fits.sections["memory"])["estimated peak"]
