"""The plan's memory estimate: its terms, the GPU refusal with the cheapest change that fits,
the same refusal on CPUs, the estimate labelled with what it counts, and device capacities. (Its
accuracy against measured peaks is a benchmark:
``benchmarks/memory_model.py``, recorded in ``benchmarks/results/memory_model.md``.)"""

from __future__ import annotations

import dataclasses

import pytest

from olmx.errors import ConfigError
from olmx.hardware import gpu_memory_gib
from olmx.plan import memory
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry

H100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3"]


def plan(tmp_path, *overrides: str):
    reg = registry()
    return plan_from_overrides([f"trainer.run_dir={tmp_path / 'run'}", *overrides], reg)


def _estimate(p):
    from olmx.plan.resolve import estimate_run

    return estimate_run(p.run, p.world, registry()).est


def test_a_7b_model_on_one_80gb_gpu_is_refused_with_the_numbers(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, *H100, "model=olmo3_7b")
    text = str(info.value)
    assert info.value.field == "memory"
    assert "is more than the 73.7 GiB usable of NVIDIA H100 80GB HBM3 (79.6 GiB less headroom)" in text
    assert "parameters 2" in text and "optimizer 4" in text  # ~6.5B float32 parameters: ~24 GiB, ~48 GiB
    assert not (tmp_path / "run").exists()


def test_the_suggested_change_is_one_the_plan_then_accepts(tmp_path) -> None:
    args = [*H100, "model=olmo3_1b", "data.seq_len=8192", "trainer.global_batch_size=16", "trainer.micro_batch_size=16"]
    with pytest.raises(ConfigError, match="cheapest change that fits: trainer.activation_checkpointing=full") as info:
        plan(tmp_path, *args)
    assert "(estimated " in str(info.value)
    fitted = plan(tmp_path, *args, "trainer.activation_checkpointing=full")
    rows = dict(fitted.sections["memory"])
    assert rows["estimated peak"].endswith(
        "of 73.7 GiB usable per process (NVIDIA H100 80GB HBM3: 80 GiB less 2 GiB for the CUDA context, NCCL and "
        "cuBLAS, less 5% for fragmentation)"
    )
    assert "without checkpointing" in rows["activations"]


def test_gpu_fit_leaves_headroom_for_what_the_estimate_does_not_count(tmp_path) -> None:
    """A peak between the usable memory and the GPU's whole memory is refused: the CUDA context,
    NCCL's buffers and cuBLAS's workspaces take the rest."""
    p = plan(tmp_path, *H100, "model=olmo3_1b")
    est = _estimate(p)
    usable = memory.usable_gib(p.world)
    assert usable == pytest.approx((79.6 - memory.CUDA_RESERVED_GIB) * (1 - memory.FRAGMENTATION))
    between = dataclasses.replace(est, params=est.params + int((usable + 1) * memory.GIB) - est.peak)
    assert usable * memory.GIB < between.peak < 79.6 * memory.GIB
    with pytest.raises(ConfigError, match="usable"):
        memory.check(between, p.run, p.mesh, p.world, p.params.total, p.vocab_size, p.dtypes.param)
    cpu = dataclasses.replace(p.world, device="cpu")
    assert memory.usable_gib(cpu) == p.world.device_memory_gib  # CPUs: no CUDA context to leave room for


def test_fsdp_shards_the_model_state_and_checkpointing_cuts_activations(tmp_path) -> None:
    gpus = [*H100, "infra.gpus_per_node=8", "model=olmo3_1b", "trainer.global_batch_size=64"]
    gpus += ["precision=fp32"]  # (bf16 differs between the two: autocast under DDP, FSDP's casts)
    ddp, fsdp = _estimate(plan(tmp_path, *gpus)), _estimate(plan(tmp_path, *gpus, "parallel=[fsdp]"))
    assert ddp.params == 8 * fsdp.params and ddp.optimizer == 8 * fsdp.optimizer == 2 * 8 * fsdp.params
    assert ddp.activations == fsdp.activations
    full = _estimate(plan(tmp_path, *gpus, "parallel=[fsdp]", "trainer.activation_checkpointing=full"))
    assert full.activations < fsdp.activations / 4 and full.activations_no_ac == fsdp.activations
    longer = _estimate(plan(tmp_path, *gpus, "data.seq_len=4096", "trainer.micro_batch_size=4"))
    assert longer.activations > ddp.activations


def test_on_cpus_an_estimate_over_the_ram_share_is_refused_with_the_cheapest_change(tmp_path) -> None:
    """The kernel would kill the workers: refused as on a GPU, with the change that fits."""
    p = plan(tmp_path, "infra.nproc_per_node=1", "data.seq_len=1024")
    base = _estimate(p)
    small = dataclasses.replace(p.world, device_memory_gib=(base.peak - base.activations / 2) / memory.GIB)
    with pytest.raises(ConfigError, match="cheapest change that fits: trainer.activation_checkpointing=full") as info:
        memory.check(base, p.run, p.mesh, small, p.params.total, p.vocab_size, p.dtypes.param)
    assert info.value.field == "memory" and f"estimated peak {memory.gib(base.peak)} per process" in str(info.value)
    roomy = dataclasses.replace(small, device_memory_gib=1e6)
    assert memory.check(base, p.run, p.mesh, roomy, p.params.total, p.vocab_size, "float32") == []
    rows = dict(p.sections["memory"])  # what the estimate counts, and what a run's peak is compared as
    assert rows["estimated peak"].startswith(f"{memory.gib(base.peak)} live tensors of ")
    assert memory.peak_of(p.sections["memory"]) == pytest.approx(base.peak, rel=0.01)
    assert rows["measured as"].startswith("process RSS above its start")


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
    assert "of 73.7 GiB usable per process" in dict(fits.sections["memory"])["estimated peak"]


SMALL = ["model.d_model=512", "model.n_layers=4", "model.hidden_size=2048", "model.n_heads=8", "precision=fp32"]


def _tokens(p) -> int:
    return p.run.trainer.micro_batch_size * p.run.data.seq_len // p.mesh.cp


def test_ulysses_halves_the_activations_and_adds_its_replicated_kv_heads(tmp_path) -> None:
    args = [*H100, "infra.gpus_per_node=2", *SMALL, "model.n_kv_heads=1", "data.seq_len=8192"]
    args += ["trainer.micro_batch_size=1", "parallel=[ddp,ulysses]"]
    one = plan(tmp_path, *args, "parallel.ulysses.degree=1", "trainer.global_batch_size=2")
    two = plan(tmp_path, *args, "parallel.ulysses.degree=2", "trainer.global_batch_size=1")
    e1, e2 = _estimate(one), _estimate(two)
    assert (one.mesh.cp, two.mesh.cp, _tokens(two)) == (1, 2, 4096)
    assert e1.plugin_activations == 0
    d, hd, layers = 512, 64, 4
    # kept per token and layer: the output in sequence layout, and k and v of the 1 kv head
    # copied to 2 (lcm(1, 2)); the all-to-all buffers are freed before the peak
    assert e2.plugin_activations == (d + 2 * (2 - 1) * hd) * 4 * layers
    assert e2.activations == e1.activations // 2 + 4096 * e2.plugin_activations
    assert e2.params == e1.params and e2.buffers == e1.buffers == 0


def test_expert_parameters_count_once_per_ep_rank(tmp_path) -> None:
    gpus = [*H100, "infra.gpus_per_node=4", *SMALL, "data.seq_len=512", "trainer.global_batch_size=4"]
    gpus += ["trainer.micro_batch_size=1"]
    moe = ["layers=[moe]", "layers.moe.num_experts=4", "layers.moe.top_k=2", "layers.moe.hidden_size=1024"]
    ddp, ep = plan(tmp_path, *gpus, *moe, "parallel=[ddp]"), plan(tmp_path, *gpus, *moe, "parallel=[ddp_ep]")
    experts = 4 * 3 * 4 * 512 * 1024  # 4 blocks x 3 matrices x 4 experts x d x h
    e_ddp, e_ep = _estimate(ddp), _estimate(ep)
    assert e_ddp.params == 4 * ddp.params.total
    # ep degree 2 over 4 GPUs: 2 experts a rank to compute with, 1 at rest (FSDP2 over 2 replicas)
    assert e_ep.params == 4 * (ep.params.total - experts) + 4 * experts // 4
    assert e_ep.optimizer == 2 * e_ep.params and e_ep.activations == e_ddp.activations
    assert e_ep.plugin_gathered == 2 * 3 * 2 * 512 * 1024  # a layer's 2 experts, the next prefetched
    assert e_ep.buffers == max(4 * e_ep.plugin_gathered, e_ep.params - e_ep.activations)  # fp32


def test_moe_activations_follow_top_k_and_checkpointing(tmp_path) -> None:
    args = [*H100, *SMALL, "data.seq_len=2048", "trainer.global_batch_size=1", "trainer.micro_batch_size=1"]
    moe = ["layers=[moe]", "layers.moe.num_experts=8", "layers.moe.hidden_size=1024"]
    top1, top4 = (_estimate(plan(tmp_path, *args, *moe, f"layers.moe.top_k={k}")) for k in (1, 4))
    # three more routed copies per token: each keeps 4 hidden tensors, its input and output, and
    # the router three more float32 weights and indices, in each of the 4 MoE blocks
    assert top4.activations - top1.activations == 4 * 2048 * (3 * (4 * 1024 + 2 * 512) * 4 + 3 * 3 * 4)
    dense_full = _estimate(plan(tmp_path, *args, "trainer.activation_checkpointing=full"))
    moe_full = _estimate(plan(tmp_path, *args, *moe, "trainer.activation_checkpointing=full"))
    assert moe_full.activations == dense_full.activations  # full checkpointing recomputes the MoE
    dense_lc = _estimate(plan(tmp_path, *args, "trainer.activation_checkpointing=long_context"))
    moe_lc = _estimate(
        plan(tmp_path, *args, *moe, "layers.moe.top_k=1", "trainer.activation_checkpointing=long_context")
    )
    assert moe_lc.activations - dense_lc.activations > top1.activations - _estimate(plan(tmp_path, *args)).activations
    # (long_context recomputes modules named feed_forward: the MoE is kept whole, not a delta)


def test_bf16_under_autocast_keeps_float32_norms_and_bf16_weight_copies(tmp_path) -> None:
    args = [*H100, "infra.gpus_per_node=2", *SMALL[:-1], "data.seq_len=2048", "trainer.global_batch_size=2"]
    args += ["trainer.micro_batch_size=1", "precision=bf16", "trainer.compile=false"]  # eager terms
    ddp, fsdp = plan(tmp_path, *args, "parallel=[ddp]"), plan(tmp_path, *args, "parallel=[fsdp]")
    e_ddp, e_fsdp = _estimate(ddp), _estimate(fsdp)
    assert (ddp.dtypes.param, fsdp.dtypes.param) == ("bfloat16", "bfloat16")
    # autocast (replicated parameters) keeps 14 more bytes per d per block and token than pure
    # bf16; FSDP's bf16 keeps 8 of them too: its two norms' float32 copies (no QK-norm here)
    assert e_ddp.activations - e_fsdp.activations == 4 * 2048 * (14 - 8) * 512
    fp32 = _estimate(plan(tmp_path, *args[:-1], "precision=fp32", "parallel=[ddp]"))
    assert e_ddp.buffers - fp32.buffers == 2 * ddp.params.total  # the bf16 copies of the weights
    assert fp32.activations / 2 < e_ddp.activations < fp32.activations


def test_engram_blocks_keep_their_rows_and_sharded_tables_count_per_rank(tmp_path) -> None:
    args = [*H100, "infra.gpus_per_node=2", *SMALL, "data.seq_len=512", "trainer.global_batch_size=2"]
    args += ["trainer.micro_batch_size=1", "layers=[engram]", "layers.engram.layer_ids=[1]"]
    rep = _estimate(plan(tmp_path, *args, "layers.engram.sharding=replicated"))
    two = _estimate(plan(tmp_path, *args, "layers.engram.layer_ids=[1,2]", "layers.engram.sharding=replicated"))
    d_mem = 2 * 512  # orders 2 and 3, 512 wide each
    assert rep.plugin_activations == (d_mem + 11 * 512) * 4
    assert two.plugin_activations == 2 * rep.plugin_activations
    sharded = _estimate(plan(tmp_path, *args, "layers.engram.sharding=1d"))
    tables = 2 * 8 * 5 * 384 * 64  # 2 orders x 8 heads x rows (primes above 5 x the vocabulary) x 64
    assert sharded.activations == rep.activations
    assert rep.params - sharded.params == pytest.approx(4 * tables / 2, rel=0.05)  # half the rows a rank
