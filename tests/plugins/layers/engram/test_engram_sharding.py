"""Sharded Engram tables on real gloo processes, against a replicated single-process reference.

A single launch of 4 processes (spawning processes that import OLMo-core is the slow part):
tables sharded over all 4 ranks and over 2-rank sub-meshes, rows exchanged in bfloat16 vs
float32, a distributed checkpoint resharded between layouts (2d -> 1d on 4 ranks, then onto
one replicated process), one training step of a tiny model under DDP and FSDP, a few
clipped AdamW steps of it against the replicated model (the table's Adam state sharded), and
the tiny model under Ulysses with a sharded table.
"""

import math

import pytest
import torch
import torch.distributed as dist
from olmo_core.testing import run_distributed_test
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from olmx_plugins.layers.engram.sharding import (
    REPLICATE_DIM,
    SHARD_DIM,
    EngramTable,
    TableSharding,
    init_table_rows_,
    shard_row_range,
    table_mesh,
)

SIZES = [1009, 1013, 2003, 2011]
DIM = 6


def _rank_data(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, SIZES[0], (2, 7, len(SIZES)), generator=g)
    ids[0, :3] = ids[1, :3]  # repeated rows: deduplicated before sending
    upstream = torch.randn(2, 7, len(SIZES), DIM, generator=g)
    return ids, upstream


def _expected_bytes(table: EngramTable, groups: torch.Tensor) -> tuple[int, int]:
    """This rank's bytes, recomputed from every rank's data without the exchange code.

    ``groups[i, j]``: global rank holding shard ``j`` in shard group ``i``.
    """
    rank = dist.get_rank()
    n_groups, n_shards = groups.shape
    i, j = [int(v) for v in (groups == rank).nonzero()[0]]
    block = math.ceil(table.num_rows / n_shards)
    uniq = {int(r): table.rows(_rank_data(int(r))[0]).unique() for r in groups.flatten()}

    def owned(r: int, shard: int) -> torch.Tensor:
        return uniq[r][uniq[r] // block == shard]

    sent_ids = int((uniq[rank] // block != j).sum())
    served = sum(owned(int(r), j).numel() for r in groups[i] if int(r) != rank)
    forward = 8 * (n_shards - 1) + 8 * sent_ids + 4 * DIM * served
    backward = 4 * DIM * sent_ids
    if n_groups > 1:
        touched = [torch.cat([owned(int(r), j) for r in groups[g]]).unique().numel() for g in range(n_groups)]
        backward += (n_groups - 1) * (8 + max(touched) * (8 + 4 * DIM))
    return forward, backward


def _check_table(sharding: str, mesh: DeviceMesh):
    rank = dist.get_rank()
    groups = mesh.mesh.reshape(-1, mesh.size(mesh.mesh_dim_names.index(SHARD_DIM)))
    members = [int(r) for r in groups.flatten()]
    ref = EngramTable(table_sizes=SIZES, dim=DIM, init_seed=5)
    table = EngramTable(table_sizes=SIZES, dim=DIM, sharding=sharding, mesh=mesh, init_seed=5)
    shard = int((groups == rank).nonzero()[0, 1])
    start, end = table.local_row_range
    assert (start, end) == shard_row_range(sum(SIZES), groups.shape[1], shard)
    # Initialisation does not depend on the sharding.
    assert torch.equal(table.local_weight().detach(), ref.weight.detach()[start:end])

    ids, upstream = _rank_data(rank)
    out = table(ids)
    assert torch.equal(out, ref(ids))
    (out * upstream).sum().backward()

    expected = torch.zeros_like(ref.weight)
    for r in members:
        ids_r, up_r = _rank_data(r)
        ref.weight.grad = None
        (ref(ids_r) * up_r).sum().backward()
        expected += ref.weight.grad
    expected /= len(members)  # DDP/FSDP average
    grad = table.weight.grad.full_tensor()
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6)
    touched = torch.cat([table.rows(_rank_data(r)[0]).flatten() for r in members]).unique()
    assert torch.equal(grad.abs().sum(1).nonzero().flatten(), touched)

    stats = table.comm
    assert stats.lookups == ids.numel() and stats.unique_rows == table.rows(ids).unique().numel()
    assert (stats.forward_bytes, stats.backward_bytes) == _expected_bytes(table, groups)
    stats.reset()
    assert stats.total_bytes == 0


def _tables_equal_replicated():
    assert dist.get_world_size() == 4
    _check_table("1d", table_mesh("1d"))
    _check_table("2d", table_mesh("2d", shard_degree=2))
    # 2-rank tables: sub-meshes over the rank pairs {0, 1} and {2, 3}.
    pairs = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pair", SHARD_DIM))
    _check_table("1d", pairs[SHARD_DIM])
    for rep, shards in ((2, 1), (1, 2)):
        mesh = init_device_mesh("cpu", (2, rep, shards), mesh_dim_names=("pair", REPLICATE_DIM, SHARD_DIM))
        _check_table("2d", mesh[REPLICATE_DIM, SHARD_DIM])


def _table_and_optim(sharding: str, mesh: DeviceMesh | None, seed: int):
    module = torch.nn.ModuleDict(
        {"t": EngramTable(table_sizes=SIZES, dim=DIM, sharding=sharding, mesh=mesh, init_seed=seed)}
    )
    return module, torch.optim.AdamW(module.parameters(), lr=0.1, foreach=False)


def _checkpoint_across_layouts(ckpt: str):
    """Save a ``2d`` table and its Adam state (as the trainer does: OLMo-core's distributed
    checkpoint, flattened optimizer state), load them into a ``1d`` table with other values."""
    from olmo_core.distributed.checkpoint import (
        load_model_and_optim_state,
        save_model_and_optim_state,
    )

    module, opt = _table_and_optim("2d", table_mesh("2d", shard_degree=2), seed=5)
    ids, upstream = _rank_data(dist.get_rank())
    (module["t"](ids) * upstream).sum().backward()
    opt.step()
    save_model_and_optim_state(ckpt, module, opt, flatten_optimizer_state=True)
    saved = {
        "weight": module["t"].weight.full_tensor(),
        "exp_avg": opt.state[module["t"].weight]["exp_avg"].full_tensor(),
    }
    if dist.get_rank() == 0:
        torch.save(saved, f"{ckpt}/full.pt")

    other, other_opt = _table_and_optim("1d", table_mesh("1d"), seed=9)
    assert not torch.equal(other["t"].weight.full_tensor(), saved["weight"])
    load_model_and_optim_state(ckpt, other, other_opt, flatten_optimizer_state=True)
    assert torch.equal(other["t"].weight.full_tensor(), saved["weight"])
    assert torch.equal(other_opt.state[other["t"].weight]["exp_avg"].full_tensor(), saved["exp_avg"])


def _tiny_model(sharding: str, n_heads: int = 2):
    """A 2-block model with Engram at block 1, its table ``1d``-sharded or replicated."""
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    from olmx_plugins.layers.engram.block import EngramBlockConfig, EngramConfig, apply_engram_inputs
    from olmx_plugins.layers.engram.compression import TokenizerCompression, byte_level_tokens

    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    engram = EngramConfig(
        layer_ids=[1], n_embed_per_ngram=16, n_head_per_ngram=2, vocab_size_per_ngram=[300, 300], sharding=sharding
    )
    cfg = TransformerConfig.llama_like(
        d_model=32, vocab_size=384, n_layers=2, n_heads=n_heads, attn_backend=AttentionBackendName.torch
    )
    base = cfg.block
    cfg.block = {
        "dense": base,
        "engram": EngramBlockConfig(
            sequence_mixer=base.sequence_mixer,
            layer_norm=base.layer_norm,
            feed_forward=base.feed_forward,
            engram=engram,
        ),
    }
    cfg.block_pattern = ["dense", "engram"]
    model = cfg.build(init_device="meta")
    torch.manual_seed(0)
    model.init_weights(device=torch.device("cpu"))
    hasher = engram.build_hasher(pad_id=comp.canonical(257), compressed_vocab_size=comp.compressed_vocab_size)
    return apply_engram_inputs(model, compression=comp, hasher=hasher)


def _batch(r: int, step: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(r + 1000 * step))


def _optimizer(model):
    """AdamW with the tables in their own group (as the plugin sets it up)."""
    tables = [p for n, p in model.named_parameters() if n.endswith("engram.table.weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("engram.table.weight")]
    return torch.optim.AdamW(
        [{"params": rest}, {"params": tables, "lr": 5e-2, "weight_decay": 0.0}],
        lr=1e-2,
        weight_decay=0.1,
        foreach=False,
    )


def _model_step(dp: str):
    from torch.distributed.tensor import DTensor

    from olmx.worker.clip import global_grad_norm
    from olmx_plugins.layers.engram.sharding import collect_comm_stats

    rank, world = dist.get_rank(), dist.get_world_size()
    build, batch, optimizer = _tiny_model, _batch, _optimizer

    ref = build("replicated")
    model = build("1d")
    table = model.blocks["1"].engram.table
    assert table.is_sharded and isinstance(table.weight, DTensor)
    torch.testing.assert_close(table.weight.full_tensor(), ref.blocks["1"].engram.table.weight, rtol=0, atol=0)
    mesh = init_device_mesh("cpu", (world,))
    if dp == "ddp":
        model.apply_ddp(dp_mesh=mesh)
    else:
        model.apply_fsdp(dp_mesh=mesh)
    model(batch(rank), labels=batch(rank)).loss.backward()
    # Neither FSDP (which would re-shard it on the unnamed dp mesh) nor DDP manages the table.
    weight = model.blocks["1"].engram.table.weight
    assert isinstance(weight, DTensor) and weight.device_mesh.mesh_dim_names == ("engram_shard",)
    if dp == "ddp":
        from torch.distributed._composable.replicate import replicate

        managed = replicate.state(model)._param_list
        assert len(managed) == len(list(model.parameters())) - 1
        assert all(p is not weight for p in managed)
    sum(ref(batch(r), labels=batch(r)).loss for r in range(world)).div(world).backward()

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            full(p.grad), ref_params[name].grad, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{dp} {name}: {m}"
        )
    # The core's clipping norm across the table's mesh and the DDP/FSDP gradients, no gathering.
    ref_norm = torch.stack([p.grad.pow(2).sum() for p in ref.parameters()]).sum().sqrt()
    torch.testing.assert_close(global_grad_norm(model.parameters()), ref_norm, rtol=1e-5, atol=1e-6)
    ref_table = ref.blocks["1"].engram.table.weight
    stats = collect_comm_stats(model)
    assert stats.lookups == 2 * 12 * 4 and stats.forward_bytes > 0 and stats.backward_bytes > 0
    assert collect_comm_stats(model).total_bytes == 0

    if dp == "ddp":
        before = full(table.weight).detach().clone()
        opt, ref_opt = optimizer(model), optimizer(ref)
        opt.step()
        ref_opt.step()
        after = full(table.weight).detach()
        torch.testing.assert_close(after, ref_table.detach(), rtol=1e-5, atol=1e-6)
        untouched = ref_table.grad.abs().sum(1) == 0
        assert bool(untouched.any()) and torch.equal(after[untouched], before[untouched])


def _rows_cross_ranks_in_the_compute_dtype():
    """``wire_dtype=bfloat16`` (the module's compute dtype under bf16): half the bytes of every
    exchanged row and row gradient (the ids stay 8 bytes); rows come back, and gradients are
    added, in float32, equal to the float32 exchange within bfloat16's rounding."""
    rank = dist.get_rank()
    ids, upstream = _rank_data(rank)
    got = {}
    for dtype in (torch.float32, torch.bfloat16):
        table = EngramTable(table_sizes=SIZES, dim=DIM, sharding="1d", mesh=table_mesh("1d"), init_seed=5)
        out = table(ids, wire_dtype=dtype)
        (out * upstream).sum().backward()
        assert out.dtype == table.weight.grad.dtype == torch.float32
        got[dtype] = out.detach(), table.weight.grad.to_local().clone(), table.comm
    (out32, grad32, comm32), (out16, grad16, comm16) = got[torch.float32], got[torch.bfloat16]
    uniq = table.rows(ids).unique()
    sent = int((uniq // math.ceil(table.num_rows / 4) != rank).sum())
    id_bytes = 8 * (3 + sent)
    assert comm16.forward_bytes - id_bytes == (comm32.forward_bytes - id_bytes) // 2 > 0
    assert comm16.backward_bytes * 2 == comm32.backward_bytes > 0
    torch.testing.assert_close(out16, out32, rtol=2**-8, atol=0)
    torch.testing.assert_close(grad16, grad32, rtol=1e-2, atol=1e-2)
    assert not torch.equal(grad16, grad32)


def _sharded_adam_equals_replicated(steps: int = 3, max_norm: float = 0.05):
    """A few AdamW steps of the tiny model, its table ``1d`` over the 4 ranks (DDP for the rest)
    vs the replicated model on the ranks' mean loss: the same losses, clipped norms and
    parameters; each rank's Adam moments of the table are DTensors of the table's placement
    holding its quarter of the rows. The core's clipping never gathers a gradient."""
    from unittest import mock

    from torch.distributed.tensor import DTensor

    from olmx.worker.clip import clip_grad_norm_

    rank, world = dist.get_rank(), dist.get_world_size()
    ref, model = _tiny_model("replicated"), _tiny_model("1d")
    model.apply_ddp(dp_mesh=init_device_mesh("cpu", (world,)))
    opt, ref_opt = _optimizer(model), _optimizer(ref)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        loss = model(_batch(rank, step), labels=_batch(rank, step)).loss
        loss.backward()
        ref_loss = sum(ref(_batch(r, step), labels=_batch(r, step)).loss for r in range(world)) / world
        ref_loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        torch.testing.assert_close(mean / world, ref_loss.detach(), rtol=1e-5, atol=1e-6)
        with mock.patch.object(DTensor, "full_tensor", side_effect=AssertionError("clipping gathered a gradient")):
            norm = clip_grad_norm_(model.parameters(), max_norm)
        ref_norm = clip_grad_norm_(ref.parameters(), max_norm)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-5, atol=1e-7)
        assert float(ref_norm) > max_norm  # the step is clipped
        opt.step()
        ref_opt.step()

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        # The sharded run's gradients differ from the replicated one's in reduction order only
        # (~1e-7 relative), but Adam's update of an entry whose gradient is near its epsilon
        # turns that into a visible part of a step: up to 7e-6 seen, in the table, the
        # embedding and w_q, against steps of lr=1e-2 (test_engram_plugin's resume test says
        # more). 5e-5 is 0.5% of one step; a sharding or averaging error moves entries by steps.
        atol = 5e-5
        torch.testing.assert_close(
            full(p).detach(), ref_params[name].detach(), rtol=1e-4, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )
    weight = model.blocks["1"].engram.table.weight
    ref_weight = ref_params["blocks.1.engram.table.weight"]
    start, end = shard_row_range(weight.shape[0], world, rank)
    for key in ("exp_avg", "exp_avg_sq"):
        state = opt.state[weight][key]
        assert isinstance(state, DTensor) and state.device_mesh is weight.device_mesh
        assert state.placements == weight.placements and state.to_local().shape == (end - start, weight.shape[1])
        assert end - start == math.ceil(weight.shape[0] / 4)
        torch.testing.assert_close(
            state.full_tensor(),
            ref_opt.state[ref_weight][key],
            rtol=1e-4,
            atol=1e-8,
            msg=lambda m, key=key: f"{key}: {m}",
        )


def _ulysses_with_a_sharded_table():
    """Ulysses over the 4 ranks (what ``sharding=auto`` may pick under ``parallel=[...,ulysses]``):
    a ``1d`` table's gradient (its owners' sum over ranks, divided by the world) equals the
    single-process one, as the mean over ranks of every other gradient does; the rows travel
    in bfloat16 under autocast (half the float32 bytes)."""
    import torch.nn.functional as F
    from olmo_core.nn.attention.ring import UlyssesContextParallelStyle
    from torch.distributed.tensor import DTensor

    from olmx_plugins.parallel.ulysses_attention import apply_ulysses_attention

    world = dist.get_world_size()
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(7))
    labels = F.pad(ids[:, 1:], (0, 1), value=-100)

    def loss_of(model):
        out = model(ids, labels=labels, loss_reduction="sum", loss_div_factor=(labels != -100).sum())
        out.loss.backward()
        return out.loss.detach()

    ref, model = _tiny_model("replicated", n_heads=4), _tiny_model("1d", n_heads=4)
    apply_ulysses_attention(model)
    model.apply_cp(init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))["cp"], uly=UlyssesContextParallelStyle())
    ref_loss, loss = loss_of(ref), loss_of(model)
    dist.all_reduce(loss)
    torch.testing.assert_close(loss / world, ref_loss, rtol=1e-5, atol=1e-6)
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if isinstance(p.grad, DTensor):
            grad = p.grad.full_tensor()
        else:
            grad = p.grad.clone()
            dist.all_reduce(grad)
            grad /= world
        torch.testing.assert_close(grad, ref_params[name].grad, rtol=1e-4, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")

    table = model.blocks["1"].engram.table
    sent = {}
    for autocast in (False, True):
        table.comm.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss_of(model)
        sent[autocast] = table.comm.backward_bytes
    assert sent[True] * 2 == sent[False] > 0


def _world4(ckpt: str):
    _tables_equal_replicated()
    _rows_cross_ranks_in_the_compute_dtype()
    _checkpoint_across_layouts(ckpt)
    _model_step("ddp")
    _model_step("fsdp")
    _sharded_adam_equals_replicated()
    _ulysses_with_a_sharded_table()


@pytest.mark.dist
def test_sharded_tables_and_model_on_gloo_ranks(tmp_path):
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_model_and_optim_state

    ckpt = str(tmp_path / "ckpt")
    run_distributed_test(_world4, world_size=4, backend="gloo", start_method="spawn", func_args=(ckpt,))
    # The 2d table was saved once, as whole rows: its chunks tile the table (2 shards, the
    # replicate dimension deduplicated), none lost or duplicated.
    chunks = get_checkpoint_metadata(ckpt).state_dict_metadata["model.t.weight"].chunks
    tiles = sorted((c.offsets[0], c.offsets[0] + c.sizes[0]) for c in chunks)
    assert tiles == [shard_row_range(sum(SIZES), 2, i) for i in range(2)]
    assert all(c.offsets[1] == 0 and c.sizes[1] == DIM for c in chunks)
    # ... and loads into one process's replicated table.
    saved = torch.load(f"{ckpt}/full.pt")
    module, opt = _table_and_optim("replicated", None, seed=9)
    load_model_and_optim_state(ckpt, module, opt, flatten_optimizer_state=True)
    assert torch.equal(module["t"].weight.detach(), saved["weight"])
    assert torch.equal(opt.state[module["t"].weight]["exp_avg"], saved["exp_avg"])


def test_initialisation_does_not_depend_on_the_shard_boundaries():
    num_rows, dim = 150_001, 2  # three init chunks of 65,536 rows
    whole = torch.empty(num_rows, dim)
    init_table_rows_(whole, row_start=0, num_rows=num_rows, std=0.5, seed=3)
    for shards in (2, 3, 7):
        parts = []
        for i in range(shards):
            start, end = shard_row_range(num_rows, shards, i)
            part = torch.empty(end - start, dim)
            init_table_rows_(part, row_start=start, num_rows=num_rows, std=0.5, seed=3)
            parts.append(part)
        assert torch.equal(torch.cat(parts), whole)
    assert abs(float(whole.std()) - 0.5) < 0.01


def test_replicated_table_has_no_traffic_and_sharding_needs_distributed():
    table = EngramTable(table_sizes=SIZES, dim=DIM)
    ids, _ = _rank_data(0)
    table(ids).sum().backward()
    assert table.sharding == TableSharding.replicated and table.comm.total_bytes == 0
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="distributed"):
            EngramTable(table_sizes=SIZES, dim=DIM, sharding="1d")
