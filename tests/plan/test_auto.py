"""``auto`` settings (``parallel=auto``, ``trainer.activation_checkpointing=auto``,
``parallel.ulysses.degree=auto``, ``trainer.auto_micro_batch``), the plan's time estimate and the
scale warning: every ``auto`` choice is one the plan itself accepts when written out, it is
never costlier than a hand choice that fits, and refusals carry the numbers. Resolve only:
nothing trains here."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from olmx.config.compose import compose, to_object
from olmx.config.schema import AutoParallelConfig
from olmx.errors import ConfigError
from olmx.plan import throughput
from olmx.plan.auto import LOWER_BUDGETS
from olmx.plan.memory import GIB
from olmx.plan.resolve import count_params, estimate_run, padded_vocab, plan_from_overrides, resolve
from olmx.registry import registry

H100 = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.ship_data=false", "precision=bf16"]
WORLDS = {
    "cpu x1": ["infra.nproc_per_node=1"],
    "cpu x2": ["infra.nproc_per_node=2"],
    "cpu x4": ["infra.nproc_per_node=4"],
    "h100 x1": [*H100, "infra.gpus_per_node=1"],
    "h100 x8": [*H100, "infra.gpus_per_node=8"],
    "h100 2x8": [*H100, "infra.gpus_per_node=8", "infra.nodes=2"],
}
GPU_NAME = "infra.gpu_name='NVIDIA H100 80GB HBM3'"
#: ``trainer.activation_memory_budget`` values auto tries for budget checkpointing (the default first).
BUDGETS = (0.5, *LOWER_BUDGETS)
AUTO = ["parallel=auto", "trainer.activation_checkpointing=auto"]
AUTO += ["trainer.global_batch_size=16", "trainer.micro_batch_size=1"]


def plan(tmp_path, *overrides: str):
    reg = registry()
    return plan_from_overrides([f"trainer.run_dir={tmp_path / 'run'}", *overrides], reg)


def chosen(p) -> list[str]:
    return dict(p.sections["auto"])["chosen"].split()


def peak(p) -> int:
    return estimate_run(p.run, p.world, registry()).est.peak


def fits(p) -> bool:
    cap = p.world.device_memory_gib
    return cap is None or peak(p) <= cap * GIB


def flops(p) -> int:
    return throughput.flops_per_token(
        p.run.model,
        params=p.params,
        seq_len=p.run.data.seq_len,
        activation_checkpointing=p.run.trainer.activation_checkpointing,
        memory_budget=p.run.trainer.activation_memory_budget,
    ).total


@functools.cache
def base_run(*overrides: str):
    reg = registry()
    return to_object(compose(["trainer.run_dir=/nonexistent/olmx-test-auto/run", *overrides], reg), reg)


def grid_run(world: str, model: str, seq: int, *overrides: str):
    """The composed run of ``world`` with ``model`` and ``seq`` swapped in (one compose per world
    and per model preset keeps the grid fast)."""
    run = base_run(*WORLDS[world], *overrides)
    return replace(run, model=base_run(f"model={model}").model, data=replace(run.data, seq_len=seq))


@pytest.mark.parametrize("world", list(WORLDS))
def test_every_auto_choice_on_the_grid_is_accepted_when_written_out(world) -> None:
    """tiny / olmo3_1b / olmo3_7b x 256..131072 tokens: the chosen run resolves as it is, with
    nothing left to choose, to the same layout, and fits; where nothing fits a GPU, the refusal
    has the numbers (on CPUs the plan warns instead)."""
    reg = registry()
    for model in ("tiny", "olmo3_1b", "olmo3_7b"):
        for seq in (256, 4096, 32768, 131072):
            try:
                p = resolve(grid_run(world, model, seq, *AUTO), reg)
            except ConfigError as exc:
                if "cpu" in world:  # nothing fits the RAM share: refused by the plan's memory check, as on a GPU
                    assert exc.field == "memory" and "cheapest change that fits" in str(exc), (world, model, seq, exc)
                    continue
                assert "h100" in world, (world, model, seq, exc)
                assert exc.field == "parallel" and "no setting fits the 73.7 GiB usable per process" in str(exc)
                assert "GiB" in str(exc).split("(", 1)[1]  # every candidate's estimate
                continue
            explicit = resolve(p.run, reg)
            assert "auto" not in explicit.sections and explicit.mesh == p.mesh
            assert explicit.run.trainer.activation_checkpointing == p.run.trainer.activation_checkpointing
            if "auto" not in dict(p.sections.get("warnings", [])):  # a CPU run where nothing fits warns
                assert fits(explicit), (world, model, seq, chosen(p))
            else:
                assert "cpu" in world


def test_the_chosen_overrides_compose_to_the_same_plan(tmp_path) -> None:
    # 512K tokens: even full checkpointing does not fit without sequence parallelism
    args = [*WORLDS["h100 2x8"], "model=olmo3_1b", "data.seq_len=524288", *AUTO]
    p = plan(tmp_path, *args)
    assert "ulysses" in p.run.parallel  # a layout with a sequence degree, a data-parallel kind, checkpointing
    explicit = plan(tmp_path, *args[:-4], *AUTO[2:], *chosen(p))
    assert "auto" not in explicit.sections and explicit.mesh == p.mesh and fits(explicit)
    assert explicit.run.parallel == p.run.parallel


def _layouts():
    reg = registry()
    fsdp, ulysses = reg.get("parallel", "fsdp"), reg.get("parallel", "ulysses")
    yield {"ddp": reg.get("parallel", "ddp").Config()}
    yield {"fsdp": fsdp.Config()}
    for d in (2, 4, 8):
        yield {"fsdp": fsdp.Config(), "ulysses": ulysses.Config(degree=d)}


@pytest.mark.parametrize(
    ("model", "seq"), [("olmo3_1b", 65536), ("olmo3_1b", 524288), ("olmo3_7b", 8192), ("olmo3_7b", 32768)]
)
def test_auto_adds_sequence_parallelism_only_where_nothing_fits_without_it(model, seq) -> None:
    """Against every hand choice of data-parallel kind x Ulysses degree x checkpointing that the
    plan accepts: where one without sequence parallelism fits, auto adds none (it checkpoints
    activations first), and among the hand choices of auto's degree none costs fewer modelled
    FLOPs (the least recompute); where none fits without it, auto's degree is the smallest that does."""
    reg = registry()
    base = grid_run("h100 x8", model, seq, "trainer.global_batch_size=8", "trainer.micro_batch_size=1")
    hands = []
    for layout in _layouts():
        for ac, budget in [(None, 0.5), ("long_context", 0.5), ("full", 0.5)] + [("budget", b) for b in BUDGETS]:
            trainer = replace(base.trainer, activation_checkpointing=ac, activation_memory_budget=budget)
            run = replace(base, parallel=layout, trainer=trainer)
            try:
                hands.append(resolve(run, reg))
            except ConfigError as exc:
                assert exc.field in ("memory", "parallel.ulysses.degree"), exc
    assert hands, "the grid should hold a fitting hand choice"
    auto_ac = replace(base.trainer, activation_checkpointing="auto")
    p = resolve(replace(base, parallel={"auto": AutoParallelConfig()}, trainer=auto_ac), reg)
    assert fits(p)
    assert p.mesh.cp == min(h.mesh.cp for h in hands)  # 1 wherever a hand choice without it fits
    assert flops(p) == min(flops(h) for h in hands if h.mesh.cp == p.mesh.cp)  # least recompute at that degree
    if seq == 524288:
        assert p.mesh.cp > 1


def test_auto_lowers_the_micro_batch_before_it_adds_a_parallel_dimension(tmp_path) -> None:
    """The issue's first try: 7B with the default batch (16 sequences, micro-batch 8) on one node
    of 8 H100s chose Ulysses for 256-token sequences, since 16 is no multiple of 8 x 8 ranks."""
    p = plan(tmp_path, "parallel=auto", "model=olmo3_7b", "infra=slurm", "infra.gpus_per_node=8", GPU_NAME)
    assert (p.mesh.cp, p.mesh.tp, p.mesh.pp) == (1, 1, 1) and p.batch.micro_seqs == 2
    rows = dict(p.sections["auto"])
    assert rows["micro-batch"] == (
        "lowered from trainer.micro_batch_size=8 to 2: 16 sequences over 8 data-parallel ranks leave 2 per rank"
    )
    assert "the cheapest setting that fits" in rows["why"] and fits(p)


def test_ulysses_degree_auto_takes_the_smallest_degree_that_fits(tmp_path) -> None:
    args = [*WORLDS["h100 x8"], "model=olmo3_1b", "data.seq_len=131072", "trainer.global_batch_size=8"]
    args += ["trainer.micro_batch_size=1", "parallel=[fsdp,ulysses]"]
    p = plan(tmp_path, *args, "parallel.ulysses.degree=auto")
    degree = p.run.parallel["ulysses"].degree
    assert chosen(p) == [f"parallel.ulysses.degree={degree}"] and p.mesh.cp == degree > 2
    for smaller in (d for d in range(2, degree) if 8 % d == 0):  # each smaller one does not fit
        with pytest.raises(ConfigError, match="estimated peak") as info:
            plan(tmp_path, *args, f"parallel.ulysses.degree={smaller}")
        assert info.value.field == "memory"
    assert "GiB > 73.7 GiB" in dict(p.sections["auto"])["tried before"]


def test_refusals_carry_the_numbers(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, *WORLDS["h100 x1"], "model=olmo3_7b", *AUTO)
    text = str(info.value)
    assert info.value.field == "parallel"
    assert "no setting fits the 73.7 GiB usable per process of NVIDIA H100 80GB HBM3" in text
    assert "trainer.activation_checkpointing=full: " in text and "the smallest estimate is" in text
    with pytest.raises(ConfigError, match="auto chooses every parallel strategy"):
        plan(tmp_path, "parallel=[auto,ulysses]")
    with pytest.raises(ConfigError, match=r"trainer.assumed_mfu: must be a number in \(0, 1\]"):
        plan(tmp_path, "trainer.assumed_mfu=0")
    with pytest.raises(ConfigError, match="parallel.ulysses.degree: auto: no degree from 2 up divides"):
        ulysses = ["parallel=[ddp,ulysses]", "parallel.ulysses.degree=auto", "model.n_heads=1"]
        plan(tmp_path, "infra.nproc_per_node=2", *ulysses)


def test_the_largest_micro_batch_that_fits(tmp_path) -> None:
    args = [*WORLDS["h100 x8"], "model=olmo3_1b", "data.seq_len=8192", "trainer.global_batch_size=256"]
    args += ["parallel=[fsdp]", "trainer.auto_micro_batch=true"]
    p = plan(tmp_path, *args)
    micro = p.batch.micro_seqs
    assert chosen(p) == [f"trainer.micro_batch_size={micro}"] and 1 < micro < 32 and 32 % micro == 0
    assert fits(p)
    bigger = next(m for m in range(micro + 1, 33) if 32 % m == 0)
    with pytest.raises(ConfigError, match="estimated peak"):
        plan(tmp_path, *args[:-1], f"trainer.micro_batch_size={bigger}")


def test_on_cpus_auto_fits_the_ram_share_or_the_plan_refuses(tmp_path) -> None:
    """Where no setting fits a CPU's RAM share the workers would be killed by the kernel: the
    plan refuses, as on a GPU (olmx.plan.memory.check)."""
    with pytest.raises(ConfigError, match="usable of cpu .its share of the host's RAM") as info:
        plan(tmp_path, "infra.nproc_per_node=2", "model=olmo3_7b", "data.seq_len=131072", *AUTO)
    assert info.value.field == "memory" and "cheapest change that fits" in str(info.value)


def test_flops_per_token_match_olmo_core_and_recompute_adds_the_forward(tmp_path) -> None:
    from olmx.worker.model import build_model_config

    p = plan(tmp_path, *WORLDS["h100 x8"], "model=olmo3_1b", "data.seq_len=8192", "trainer.micro_batch_size=2")
    vocab = padded_vocab(p.run.data.tokenizer.vocab_size)
    model = build_model_config(p.run.model, vocab_size=vocab).build(init_device="meta")
    counts = count_params(p.run.model, vocab)
    none, full, lc = (
        throughput.flops_per_token(p.run.model, params=counts, seq_len=8192, activation_checkpointing=ac)
        for ac in (None, "full", "long_context")
    )
    assert none.model == model.num_flops_per_token(8192) and none.recompute == 0
    blocks = sum(b.num_flops_per_token(8192) for b in model.blocks.values())
    assert full.recompute == blocks // 3 and full.model == none.model
    ff = sum(6 * sum(q.numel() for q in b.feed_forward.parameters()) for b in model.blocks.values())
    assert lc.recompute == ff // 3
    rows = dict(p.sections["time"])
    assert rows["device peak"] == "989 TFLOP/s dense bfloat16 (NVIDIA H100 80GB HBM3)"
    tokens = p.batch.global_tokens
    seconds = none.total * tokens / 8 / (989e12 * 0.4)
    assert rows["step time"].startswith(f"{seconds:,.3g} s at trainer.assumed_mfu=0.4")
    assert rows["tokens/s"] == f"{tokens / seconds / 8:,.0f} per device, {tokens / seconds:,.0f} in total"
    assert "unknown (no vendor peak for CPUs)" in dict(plan(tmp_path).sections["time"])["device peak"]


def test_a_large_model_with_the_tiny_defaults_says_so(tmp_path) -> None:
    p = plan(tmp_path, *WORLDS["h100 x8"], "model=olmo3_7b", "parallel=[fsdp]", "trainer.micro_batch_size=2")
    text = dict(p.sections["warnings"])["scale"]
    assert "data.seq_len=256 x trainer.global_batch_size=16 = 4,096 tokens per step" in text
    assert "8,192-token sequences, 4,194,304 tokens per step" in text
    assert "scale" not in dict(plan(tmp_path).sections.get("warnings", []))


def test_parallel_auto_from_the_cli(tmp_path) -> None:
    args = ["--dry-run", "parallel=auto", *WORLDS["h100 2x8"], "model=olmo3_7b", "data.seq_len=8192"]
    args += ["trainer.global_batch_size=64", "trainer.micro_batch_size=1", f"trainer.run_dir={tmp_path / 'r'}"]
    proc = subprocess.run(
        [sys.executable, "-m", "olmx", "train", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},  # one table row per line
    )
    assert proc.returncode == 0, proc.stderr
    import re

    (strategy,) = re.findall(r"chosen\s+│ parallel=\[(\w+)\]", proc.stdout)
    # plain ddp cannot hold 7B with its optimizer state; ddp with the distributed optimizer
    # (ZeRO-2: optimizer state and gradients 1/16 per rank) is the least sharding that fits
    assert strategy == "ddp" and "parallel.ddp.distributed_optimizer=true" in proc.stdout
    assert "the cheapest setting that fits" in proc.stdout
    assert re.search(
        r"tried before\s+│ parallel=\[ddp\] trainer.activation_checkpointing=null: [\d.]+ GiB > 73.7 GiB", proc.stdout
    )
    config = proc.stdout.split("# resolved config")[1].split("olmx plan")[0]
    assert f"parallel:\n  {strategy}:" in config  # the resolved config is the choice, not auto
    assert not (tmp_path / "r").exists()


def test_auto_lowers_the_memory_budget_before_it_recomputes_more(tmp_path) -> None:
    """OLMo 3 32B at 8,192 tokens on 16 H100s: compiled blocks under budget checkpointing at the
    default 0.5 do not fit; auto takes the largest lower budget that does (it recomputes less than
    long_context or full, which also fit), and writes it out."""
    args = [*WORLDS["h100 2x8"], "model=olmo3_32b", "data.seq_len=8192", "trainer.global_batch_size=16"]
    args += ["trainer.micro_batch_size=1", "parallel=auto"]
    p = plan(tmp_path, *args)
    t = p.run.trainer
    assert t.activation_checkpointing == "budget" and t.activation_memory_budget in LOWER_BUDGETS
    assert chosen(p)[-2:] == [
        "trainer.activation_checkpointing=budget",
        f"trainer.activation_memory_budget={t.activation_memory_budget:g}",
    ]
    assert fits(p)
    layout = [*args[:-1], *chosen(p)[:-2]]
    for higher in (b for b in BUDGETS if b > t.activation_memory_budget):  # each higher one does not fit
        with pytest.raises(ConfigError) as info:
            plan(
                tmp_path,
                *layout,
                "trainer.activation_checkpointing=budget",
                f"trainer.activation_memory_budget={higher}",
            )
        assert info.value.field == "memory"
    for mode in ("long_context", "full"):  # both fit, and recompute more
        other = plan(tmp_path, *layout, f"trainer.activation_checkpointing={mode}")
        assert fits(other) and flops(other) > flops(p)
