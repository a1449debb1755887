"""Expert parallelism of the portable MoE in real gloo processes, against one process.

Every rank builds the same single-process reference (same seeded init) and runs it on all
ranks' inputs; the expert-parallel layer runs on its own rank's input. Checked: outputs, aux
losses, the gradients of every parameter (dense ones averaged over ranks as DDP does, expert
ones through the EP backward + FSDP over the replica group) and the local expert shapes; under
bf16 autocast, the dtype of the rows on the wire.

The processes are forked, not spawned: a spawned child re-imports torch and OLMo-core
(~15 s of CPU each, including the torch._dynamo import that ``Transformer.init_weights``
triggers), which made these two tests take 4 minutes on the 2-core machine instead of under
one. Forking after the parent ran torch ops is safe once each child uses a single intra-op
thread (as PyTorch's own DataLoader workers do), which is also right for several processes
on 2 cores.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from olmo_core.testing import run_distributed_test
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from olmx.worker.clip import clip_grad_norm_
from olmx_plugins.layers.moe.expert_parallel import all_to_all, apply_expert_parallel
from olmx_plugins.layers.moe.modules import MoEFeedForward, moe_layers

pytestmark = pytest.mark.dist

D, H, E = 8, 16, 8
TOL = dict(rtol=1e-5, atol=1e-6)


def _moe(**kw) -> MoEFeedForward:
    args = dict(
        num_experts=E,
        hidden_size=H,
        top_k=2,
        shared_hidden_size=8,
        lb_loss_weight=0.1,
        z_loss_weight=0.01,
        bias_gamma=0.05,
        init_std=0.3,
        seed_key="ep-test",
    )
    args.update(kw)
    return MoEFeedForward(D, **args)


def _inputs(world: int):
    """Rank s gets 5 + 3 s tokens (uneven), plus an output cotangent."""
    gen = torch.Generator().manual_seed(1234)
    xs = [torch.randn(5 + 3 * s, D, generator=gen) for s in range(world)]
    gs = [torch.randn(5 + 3 * s, D, generator=gen) for s in range(world)]
    return xs, gs


def _check_ep(ep_degree: int, capacity_factor: float | None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // ep_degree
    mesh = init_device_mesh("cpu", (replicas, ep_degree), mesh_dim_names=("ep_replicate", "ep_shard"))
    xs, gs = _inputs(world)

    # Single-process reference: the mean over ranks of each rank's loss. An attached aux loss
    # enters the gradient with weight 1 whatever the main loss is scaled by, and DDP averages
    # the ranks' gradients, so the reference divides the aux losses by the world size through
    # loss_div_factor.
    ref = _moe(capacity_factor=capacity_factor)
    ref_outs = []
    total = 0.0
    for x, g in zip(xs, gs, strict=True):
        out = ref(x, loss_div_factor=x.shape[0] * world)
        ref_outs.append((out.detach(), {k: v * world for k, v in ref.last_aux_losses.items()}))
        total = total + (out * g).sum() / x.shape[0]
    (total / world).backward()

    ep = _moe(capacity_factor=capacity_factor)
    assert apply_expert_parallel(ep, ep_mesh=mesh["ep_shard"], replicate_mesh=mesh["ep_replicate"]) == 1
    x, g = xs[rank], gs[rank]
    out = ep(x, loss_div_factor=x.shape[0])
    ((out * g).sum() / x.shape[0]).backward()

    torch.testing.assert_close(out.detach(), ref_outs[rank][0], **TOL)
    for name, value in ref_outs[rank][1].items():
        torch.testing.assert_close(ep.last_aux_losses[name], value, **TOL)

    ref_params = dict(ref.named_parameters())
    for name, p in ep.named_parameters():
        if name.startswith("experts."):
            # DTensor on the 2-D (replica, ep) mesh: FSDP shard of this rank's E/ep experts.
            assert isinstance(p, DTensor) and p.grad is not None, name
            assert p.shape == ref_params[name].shape, name  # global shape unchanged
            torch.testing.assert_close(p.full_tensor(), ref_params[name].detach(), **TOL)
            torch.testing.assert_close(p.grad.full_tensor(), ref_params[name].grad, **TOL, msg=name)
        else:  # dense: average over all ranks as DDP would
            grad = p.grad.clone()
            dist.all_reduce(grad)
            torch.testing.assert_close(grad / world, ref_params[name].grad, **TOL, msg=name)
    # Aux-loss-free bias: counts summed over all ranks give the reference's update. (The
    # reference's own all-reduce multiplies its already global counts by the world size, which
    # leaves sign(mean - count) unchanged.)
    ep.update_expert_bias()
    ref.update_expert_bias()
    assert ep.router.score_bias.abs().sum() > 0
    torch.testing.assert_close(ep.router.score_bias, ref.router.score_bias)
    # Between forwards the experts are resharded: E/ep experts per EP rank, split over replicas.
    local = ep.experts.w1.to_local()
    assert local.shape[1:] == (D, H)
    held = torch.tensor([local.shape[0]])
    dist.all_reduce(held, group=mesh["ep_replicate"].get_group())
    assert held.item() == E // ep_degree


class _Wire(TorchDispatchMode):
    """Records the dtype of every tensor the expert-parallel row exchange sends (the functional
    ``all_to_all_single``, forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops._c10d_functional.all_to_all_single.default:
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def _check_rows_travel_in_the_compute_dtype(ep_degree: int) -> None:
    """Under bf16 autocast (how the core applies bf16 over replicated parameters, ddp_ep) the
    rows go to their experts and come back in bfloat16, and so do their gradients (half the
    bytes of the float32 residual stream); the output and the input gradient are the
    single-process layer's under the same autocast, within bfloat16's tolerance (the experts
    cast their rows to bfloat16 on arrival anyway: measured equal)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // ep_degree, ep_degree), mesh_dim_names=("ep_replicate", "ep_shard"))
    xs, gs = _inputs(world)
    ref, ep = _moe(), _moe()
    apply_expert_parallel(ep, ep_mesh=mesh["ep_shard"], replicate_mesh=mesh["ep_replicate"])
    x_ref, x = (xs[rank].clone().requires_grad_() for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_ref = ref(x_ref)  # dropless: a token's output depends on its own routing only
        (out_ref * gs[rank]).sum().backward()
        with _Wire() as wire:
            out = ep(x)
            (out * gs[rank]).sum().backward()
    assert wire.dtypes == [torch.bfloat16] * 4  # rows there and back, then their gradients
    bf16 = dict(rtol=1.6e-2, atol=1e-5)  # torch.testing's bfloat16 tolerance
    torch.testing.assert_close(out, out_ref, **bf16)
    torch.testing.assert_close(x.grad, x_ref.grad, **bf16)


def _check_all_to_all_uneven() -> None:
    """Uneven splits, forward values and the swapped-split backward, on gloo."""
    rank, world = dist.get_rank(), dist.get_world_size()
    send = [(rank + p) % 3 for p in range(world)]  # rows for peer p
    recv = [(p + rank) % 3 for p in range(world)]  # rows from peer p
    x = (
        torch.stack([torch.full((2,), 100.0 * rank + p) for p, n in enumerate(send) for _ in range(n)])
        if sum(send)
        else torch.zeros(0, 2)
    )
    x.requires_grad_(True)
    y = all_to_all(x, output_split_sizes=recv, input_split_sizes=send, group=dist.group.WORLD)
    expected = [100.0 * p + rank for p, n in enumerate(recv) for _ in range(n)]
    assert y[:, 0].tolist() == expected
    (y * torch.arange(1, y.shape[0] + 1).unsqueeze(1)).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = -100
    return labels


def _check_model(ep_degree: int, dp: str) -> None:
    """Tiny OLMo-core model (dense + MoE block) wrapped by OLMo-core's own DDP or HSDP."""
    from moe_testing import tiny_moe_model_config

    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // ep_degree
    cfg = tiny_moe_model_config()
    gen = torch.Generator().manual_seed(99)
    batches = [torch.randint(0, 384, (2, 12), generator=gen) for _ in range(world)]
    n_loss = 2 * 11  # tokens with a label per rank (OLMo-core's loss_div_factor)

    ref = cfg.build(init_device="cpu")
    ref.init_weights(device=torch.device("cpu"))
    total = 0.0
    ref_losses = []
    for ids in batches:  # aux and CE losses both divided by world size via loss_div_factor
        loss = ref(ids, labels=_labels(ids), loss_reduction="sum", loss_div_factor=n_loss * world).loss
        ref_losses.append(loss.detach() * world)
        total = total + loss
    total.backward()
    ref_params = dict(ref.named_parameters())

    # World mesh as OLMo-core names it for EP; the DP wrapper gets OLMo-core's DP sub-mesh.
    from olmo_core.distributed.parallel import get_dp_model_mesh

    model = cfg.build(init_device="meta")
    if dp == "ddp":  # DDP over all ranks (flattened mesh), experts sharded over "ep_shard"
        mesh = init_device_mesh("cpu", (replicas, ep_degree), mesh_dim_names=("ep_replicate", "ep_shard"))
        apply_expert_parallel(model, ep_mesh=mesh["ep_shard"], replicate_mesh=mesh["ep_replicate"])
        model.apply_ddp(dp_mesh=get_dp_model_mesh(mesh))
    else:  # HSDP on the same 2-D mesh, EP over its shard dimension (as OLMo-core's EP)
        mesh = init_device_mesh("cpu", (replicas, ep_degree), mesh_dim_names=("dp_replicate", "dp_shard"))
        apply_expert_parallel(model, ep_mesh=mesh["dp_shard"], replicate_mesh=mesh["dp_replicate"])
        model.apply_fsdp(dp_mesh=get_dp_model_mesh(mesh))
    model.init_weights(device=torch.device("cpu"))
    ids = batches[rank]
    ref_norm = torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()])
    for _ in range(2):  # a second step checks that the wrappers' per-forward hooks keep working
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=_labels(ids), loss_reduction="sum", loss_div_factor=n_loss)
        out.loss.backward()

        torch.testing.assert_close(out.loss.detach(), ref_losses[rank], **TOL)
        names = set()
        for name, p in model.named_parameters():
            names.add(name)
            full = p.full_tensor() if isinstance(p, DTensor) else p
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            torch.testing.assert_close(full.detach(), ref_params[name].detach(), msg=f"init {name}")
            torch.testing.assert_close(grad, ref_params[name].grad, **TOL, msg=f"grad {name}")
        assert names == set(ref_params)
    (moe,) = moe_layers(model)
    assert moe.experts.w1.shape == (4, 64, 32)
    if dp == "hsdp":  # all gradients live on one mesh, so OLMo-core's own grad-norm code applies
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        torch.testing.assert_close(norm.full_tensor(), ref_norm, **TOL)
    else:  # mixed plain / DTensor gradients: OLMo-core's code raises, clip_grad_norm_ works
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    norm = clip_grad_norm_(model.parameters(), max_norm=0.5 * ref_norm.item())
    torch.testing.assert_close(norm, ref_norm, **TOL)
    torch.nn.utils.clip_grads_with_norm_(ref.parameters(), 0.5 * ref_norm.item(), ref_norm)
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        torch.testing.assert_close(grad, ref_params[name].grad, **TOL, msg=f"clipped grad {name}")


def _run_checks(ep_degrees: list[int]) -> None:
    torch.set_num_threads(1)  # see the module docstring
    _check_all_to_all_uneven()
    for ep_degree in ep_degrees:
        _check_ep(ep_degree, capacity_factor=None)
        _check_rows_travel_in_the_compute_dtype(ep_degree)
    _check_ep(ep_degrees[-1], capacity_factor=0.6)
    for ep_degree in ep_degrees:
        for dp in ("ddp", "hsdp"):
            _check_model(ep_degree, dp)


def _launch(world_size: int, ep_degrees: list[int]) -> None:
    # Import in the parent what every child needs, so the forked children inherit it.
    import moe_testing  # noqa: F401
    import olmo_core.nn.ddp  # noqa: F401  (imported by Transformer.init_weights)

    run_distributed_test(
        _run_checks, world_size=world_size, backend="gloo", start_method="fork", func_args=(ep_degrees,)
    )


def test_expert_parallel_two_processes():
    """EP degree 2 = world size: module, and the tiny model under OLMo-core DDP and HSDP."""
    _launch(2, [2])


def test_expert_parallel_four_processes_with_and_without_replicas():
    """World 4: EP 4 (no replicas) and EP 2 x 2 replicas, module and model, DDP and HSDP."""
    _launch(4, [4, 2])
