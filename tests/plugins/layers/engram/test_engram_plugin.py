"""The engram layer plugin through the real CLI: plan, refusals, distributed equality, and the
checkpoint round trip of sharded tables (same and different world size)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from olmx.cli import app
from olmx.rundir import RunDir
from olmx_plugins.layers.engram.config import EngramDecisions
from tests.conftest import olmx_cli

TINY = [
    "layers=[engram]",
    "layers.engram.n_embed_per_ngram=64",
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=128",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.max_steps=6",
    "trainer.warmup_steps=2",
    "trainer.save_interval=100",
    "trainer.report=false",
]


def dry_run(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner().invoke(app, ["train", "--dry-run", *args])


def test_plan_shows_tables_and_traffic(tmp_path, monkeypatch):
    from olmx_plugins.layers.engram import NgramHasher

    out = dry_run(tmp_path, monkeypatch, *TINY).stdout
    sizes = NgramHasher(
        layer_ids=[1],
        max_ngram_size=3,
        n_head_per_ngram=8,
        vocab_size_per_ngram=[1920, 1920],
        pad_id=0,
        seed=0,
        compressed_vocab_size=229,
    ).table_sizes(1)
    assert f"block 1: 16 heads, {sum(sizes):,} rows x 8, {sum(sizes) * 8:,} params" in out
    assert "lookups per step" in out and f"{8 * 64 * 16:,} rows" in out


@pytest.mark.parametrize(
    ("args", "field", "text"),
    [
        (["layers.engram.layer_ids=[5]"], "layers.engram.layer_ids", "[5] outside [0, model.n_layers=2)"),
        (
            ["layers.engram.n_embed_per_ngram=60"],
            "layers.engram.n_head_per_ngram",
            "8 must divide layers.engram.n_embed_per_ngram=60",
        ),
        (["layers.engram.vocab_size_per_ngram=[100]"], "layers.engram.vocab_size_per_ngram", "needs 2 entries"),
        (
            ["layers.engram.max_ngram_size=4", "layers.engram.vocab_size_per_ngram=[500,500]"],
            "layers.engram.vocab_size_per_ngram",
            "needs 3 entries (orders 2..4), got 2",
        ),
        (
            ["layers.engram.vocab_size_per_ngram=[500,1]"],
            "layers.engram.vocab_size_per_ngram",
            "each an integer >= 2 or null, got [500, 1]",
        ),
        (["layers.engram.layer_ids=[]"], "layers.engram.layer_ids", "must name at least one block"),
        (["layers.engram.layer_ids=[1,1]"], "layers.engram.layer_ids", "[1, 1] has duplicates"),
        (["layers.engram.max_ngram_size=1"], "layers.engram.max_ngram_size", "an integer in [2, 16], got 1"),
        (
            ["layers.engram.n_head_per_ngram=0"],
            "layers.engram.n_head_per_ngram",
            "a positive integer dividing n_embed_per_ngram, got 0",
        ),
        (["layers.engram.kernel_size=0"], "layers.engram.kernel_size", "a positive integer, got 0"),
        (["layers.engram.sharding=3d"], "layers.engram.sharding", "replicated, 1d, 2d"),
        (["layers.engram.sharding=2d"], "layers.engram.shard_degree", "sharding=2d needs a shard_degree"),
        (
            ["layers.engram.sharding=2d", "layers.engram.shard_degree=-2"],
            "layers.engram.shard_degree",
            "must be a positive integer or null, got -2",
        ),
    ],
)
def test_refusals(tmp_path, monkeypatch, args, field, text):
    result = dry_run(tmp_path, monkeypatch, *TINY, *args)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"error: {field}: ") and text in result.stderr


def test_experiments_resolve(tmp_path, monkeypatch):
    assert dry_run(tmp_path, monkeypatch, "experiment=engram_tiny").exit_code == 0
    with open(tmp_path / "tokens.npy", "wb") as f:  # one step of engram_3p5b: 32 x 4096 uint32 ids (sparse)
        f.truncate(4 * 32 * 4096)
    a40s = ["infra=runpod", "infra.gpu_type=NVIDIA A40", "infra.gpus_per_node=4", "infra.ship_data=false"]
    # planned on the 4 A40s it was trained on (on this CPU its 21 GiB a process is refused)
    out = dry_run(tmp_path, monkeypatch, "experiment=engram_3p5b", f"data.paths=[{tmp_path}/tokens.npy]", *a40s)
    assert out.exit_code == 0, out.stderr
    total = int(
        next(line for line in out.stdout.splitlines() if "│ parameters " in line)
        .split("│")[2]
        .split()[0]
        .replace(",", "")
    )
    assert 3.3e9 < total < 3.7e9
    assert "dp_replicate=1 x dp_shard=4" in out.stdout and "bfloat16" in out.stdout


#: Tables just over ``sharding=auto``'s 1 GiB of replicated state a rank: 16 heads x ~600,000
#: rows x 8 = ~77M parameters x 16 bytes.
LARGE_TABLES = "layers.engram.vocab_size_per_ngram=[600000,600000]"


@pytest.mark.parametrize(
    ("procs", "layout"),
    [
        (1, ["parallel=[]"]),
        (2, ["parallel=[ddp]"]),
        (2, ["parallel=[fsdp]"]),
        (4, ["parallel=[hsdp]", "parallel.hsdp.shard_degree=2"]),
        (2, ["parallel=[fsdp,ulysses]"]),
        (4, ["parallel=[ddp,ulysses]"]),
        (4, ["parallel=[ddp_ep]", "layers=[moe,engram]", "layers.moe.num_experts=4"]),
        (
            4,
            [
                "parallel=[hsdp]",
                "parallel.hsdp.expert_parallel=true",
                "layers=[moe,engram]",
                "layers.moe.num_experts=4",
            ],
        ),
    ],
)
def test_auto_sharding_shards_large_tables_of_several_ranks_and_the_plan_accepts_it(procs, layout):
    """``sharding=auto`` (the default): ``1d`` where there is more than one rank and the tables'
    replicated state passes 1 GiB a rank, else ``replicated``; every choice on this grid of
    layouts resolves, is saved as the plan's decision and builds the tables it names."""
    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import resolve
    from olmx.registry import registry
    from olmx_plugins.layers.engram.plugin import ENGRAM

    reg = registry()
    for large in (False, True):
        overrides = [
            *TINY,
            "trainer.micro_batch_size=2",
            f"infra.nproc_per_node={procs}",
            *layout,
            *([LARGE_TABLES] if large else []),
        ]
        run = to_object(compose(overrides, reg), reg)
        assert run.layers["engram"].sharding == "auto"
        plan = resolve(run, reg)
        expected = "1d" if procs > 1 and large else "replicated"
        assert plan.decisions["layers.engram"] == EngramDecisions(sharding=expected)
        row = dict(plan.sections["layers.engram"])["sharding"]
        assert row.startswith(f"{expected} (auto: ")
        assert ENGRAM.engram_config(run.layers["engram"], plan).sharding == expected


#: The 2-process run with 1d-sharded tables: 6 steps, checkpoints at steps 3 and 6.
SHARDED_1D = ["parallel=[ddp]", "layers.engram.sharding=1d", "trainer.save_interval=3"]
TABLE_KEY = "model.blocks.1.engram.table.weight"


def losses(run_dir: Path) -> list[float]:
    """The loss of every step recorded in ``run_dir``."""
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train(run_dir: Path, *extra: str) -> list[float]:
    """Run the tiny Engram model in ``run_dir`` (resuming from its checkpoints); its losses."""
    proc = olmx_cli("train", *TINY, f"trainer.run_dir={run_dir}", *extra)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    return losses(run_dir)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    """Run dir of the uninterrupted ``SHARDED_1D`` run, shared by the tests of this module."""
    run_dir = tmp_path_factory.mktemp("engram") / "ddp_1d"
    train(run_dir, *SHARDED_1D)
    return run_dir


def checkpoint(path: Path) -> tuple[dict, object]:
    """Every model and optimizer entry of an OLMo-core checkpoint, unsharded, and its metadata."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

    metadata = get_checkpoint_metadata(str(path / "model_and_optim"))
    keys = sorted(metadata.state_dict_metadata)
    return dict(zip(keys, load_keys(str(path / "model_and_optim"), keys), strict=True)), metadata


def assert_states_equal(a: dict, b: dict, **tolerance) -> None:
    """Same keys; tensors equal within ``tolerance`` (``torch.testing.assert_close``)."""
    import torch

    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, b[key], **tolerance, msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert value == b[key], key


@pytest.mark.dist
def test_sharded_and_distributed_runs_equal_the_single_process_run(tmp_path, sharded_run):
    single = train(tmp_path / "single", "infra.nproc_per_node=1", "parallel=[]")
    ddp = train(tmp_path / "ddp", "parallel=[ddp]")
    sharded = losses(sharded_run)
    assert len(single) == 6 and single[-1] < single[0] - 0.3
    assert ddp == pytest.approx(single, rel=2e-5)
    assert sharded == pytest.approx(single, rel=2e-5)


@pytest.mark.dist
def test_sharded_checkpoint_resumes_exactly_and_onto_one_process(tmp_path, sharded_run):
    """Fresh processes resumed from the step-3 checkpoint of the uninterrupted 1d run (what a
    stopped run resumes from; ``tests/test_training.py`` covers the stop itself)."""
    from olmx_plugins.layers.engram.sharding import shard_row_range

    whole_losses = losses(sharded_run)
    whole, _ = checkpoint(sharded_run / "checkpoints" / "step6")
    step3 = sharded_run / "checkpoints" / "step3"

    # The sharded table was saved as whole rows: one chunk per rank, together exactly the table.
    saved, metadata = checkpoint(step3)
    rows, dim = saved[TABLE_KEY].shape
    chunks = metadata.state_dict_metadata[TABLE_KEY].chunks
    tiles = sorted((c.offsets[0], c.offsets[0] + c.sizes[0]) for c in chunks)
    assert tiles == [shard_row_range(rows, 2, i) for i in range(2)]
    assert all(c.offsets[1] == 0 and c.sizes[1] == dim for c in chunks)

    # Resumed on 2 processes: bitwise the uninterrupted run (losses and final state).
    same, one = tmp_path / "same", tmp_path / "one"
    for run_dir in (same, one):
        shutil.copytree(step3, run_dir / "checkpoints" / "step3")
        RunDir(run_dir).claim()  # a run directory of olmx's, holding a copy of the checkpoint
    assert train(same, *SHARDED_1D) == whole_losses[3:]
    assert_states_equal(checkpoint(same / "checkpoints" / "step6")[0], whole, rtol=0, atol=0)

    # Resumed on 1 process with a replicated table: the DTensor rows load into a plain tensor;
    # equal to the 2-process run up to the reduction order (as 1 vs 2 processes without resume).
    resumed = train(one, "infra.nproc_per_node=1", "parallel=[]", "layers.engram.sharding=replicated")
    assert resumed == pytest.approx(whole_losses[3:], rel=2e-5)
    # Adam's moments of near-zero gradients carry the reduction-order noise of 1 vs 2 processes
    # (and of 2 vs 1 threads per process): up to 1.6e-6 absolute seen, before and after the
    # plugin-contract change, where the values are ~1e-4. That noise reaches the parameters
    # through Adam's updates: with the tables drawn at std 0.02 (model.init_std) rather than
    # 1.0 the relative tolerance no longer hides it there (1.6e-5 absolute seen, 1 entry).
    resumed_state = checkpoint(one / "checkpoints" / "step6")[0]
    import torch

    torch.testing.assert_close(resumed_state.pop(TABLE_KEY), whole[TABLE_KEY], rtol=1e-4, atol=5e-5)
    assert_states_equal(resumed_state, {k: v for k, v in whole.items() if k != TABLE_KEY}, rtol=1e-4, atol=5e-6)


@pytest.mark.parametrize("listed", ["layers=[moe,engram]", "layers=[engram,moe]"])
@pytest.mark.parametrize("placement", ["layers.moe.every=2", "layers.moe.blocks=[1]"])
def test_engram_extends_the_blocks_another_layer_plugin_placed(placement, listed):
    """MoE and Engram, listed either way (moe's ``order`` places it first): Engram goes before
    the attention of the portable MoE block (and of the dense block next to it), placed by
    named blocks or by block overrides; both train."""
    import torch

    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import resolve
    from olmx.registry import registry
    from olmx.worker.model import build_model
    from olmx_plugins.layers.engram.block import EngramTransformerBlock
    from olmx_plugins.layers.moe.block import MoEBlock

    reg = registry()
    run = to_object(
        compose([listed, placement, "layers.moe.num_experts=4", "layers.engram.layer_ids=[0,1]", *TINY[1:]], reg), reg
    )
    plan = resolve(run, reg)
    model = build_model(plan, reg)
    model.init_weights(device=torch.device("cpu"))
    dense, moe = model.blocks["0"], model.blocks["1"]
    assert type(dense) is EngramTransformerBlock
    assert isinstance(moe, MoEBlock) and type(moe).__name__ == "EngramMoEBlock"
    ids = torch.randint(0, 256, (2, 16))
    model(ids).sum().backward()
    for block in (dense, moe):
        assert block.engram.table.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in moe.moe.parameters() if p.requires_grad)
