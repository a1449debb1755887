"""Single-process tests of the portable MoE maths (router, dispatch, experts, aux losses)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from olmx_plugins.layers.moe.modules import (
    MoEFeedForward,
    MoERouter,
    expert_capacity,
    grouped_matmul,
    load_balancing_loss,
    router_z_loss,
    sort_by_expert,
)

D, H, E = 8, 12, 4


def make_moe(**kw) -> MoEFeedForward:
    args = dict(num_experts=E, hidden_size=H, top_k=2, init_std=0.3)
    args.update(kw)
    return MoEFeedForward(D, **args)


def swiglu_all_experts(x, w1, w2, w3):
    """Every expert applied to every token: [E, N, d]."""
    return torch.einsum(
        "enh,ehd->end", F.silu(torch.einsum("nd,edh->enh", x, w1)) * torch.einsum("nd,edh->enh", x, w3), w2
    )


def dense_reference(moe: MoEFeedForward, x: torch.Tensor, keep: torch.Tensor | None = None):
    """Direct per-token computation of the chosen experts (no sorting, no grouping)."""
    logits = x.float() @ moe.router.weight.float().T
    scores = logits.softmax(-1) if moe.router.gating == "softmax" else torch.sigmoid(logits) + 1e-7
    bias = 0 if moe.router.score_bias is None else moe.router.score_bias
    idx = torch.topk(scores + bias, moe.top_k, dim=-1).indices
    w = scores.gather(-1, idx)
    if moe.router.normalize_expert_weights is not None:
        w = w / w.norm(p=moe.router.normalize_expert_weights, dim=-1, keepdim=True)
    if keep is not None:
        w = w * keep.view_as(w)
    y = swiglu_all_experts(x, moe.experts.w1, moe.experts.w2, moe.experts.w3)  # [E, N, d]
    tok = torch.arange(x.shape[0])
    out = sum(w[:, j, None] * y[idx[:, j], tok] for j in range(moe.top_k))
    return out, logits, scores, idx


def test_router_softmax_topk_and_counts():
    torch.manual_seed(0)
    router = MoERouter(D, E, top_k=2, init_std=0.5)
    x = torch.randn(10, D)
    r = router(x)
    scores = (x @ router.weight.T).softmax(-1)
    ref_w, ref_i = torch.topk(scores, 2, dim=-1)
    torch.testing.assert_close(r.scores, scores)
    assert torch.equal(r.expert_indices, ref_i)
    torch.testing.assert_close(r.expert_weights, ref_w)
    assert (r.expert_weights[:, 0] >= r.expert_weights[:, 1]).all()
    assert torch.equal(r.tokens_per_expert, torch.bincount(ref_i.flatten(), minlength=E))
    assert r.tokens_per_expert.sum() == 20


def test_router_sigmoid_with_renormalisation():
    torch.manual_seed(1)
    router = MoERouter(D, E, top_k=3, gating="sigmoid", normalize_expert_weights=1.0, init_std=0.5)
    x = torch.randn(6, D)
    r = router(x)
    scores = torch.sigmoid(x @ router.weight.T) + 1e-7
    top = torch.topk(scores, 3, dim=-1)
    torch.testing.assert_close(r.expert_weights, top.values / top.values.sum(-1, keepdim=True))
    torch.testing.assert_close(r.expert_weights.sum(-1), torch.ones(6))
    # sigmoid scores are independent per expert: they do not sum to one
    assert (r.scores.sum(-1) - 1).abs().max() > 0.1


def test_expert_bias_changes_selection_not_weights_and_update_direction():
    torch.manual_seed(2)
    router = MoERouter(D, E, top_k=1, bias_gamma=0.01, init_std=0.5)
    x = torch.randn(16, D)
    router.score_bias[2] = 10.0  # forces expert 2 for every token
    r = router(x)
    assert (r.expert_indices == 2).all()
    torch.testing.assert_close(r.expert_weights[:, 0], r.scores[:, 2])  # unbiased combine weight
    # the update moves each bias by gamma towards balance: overloaded experts (count above the
    # mean 4) down, underloaded ones up
    assert router.bias_tokens_per_expert.tolist() == [0, 0, 16, 0]  # training forward counted
    router.score_bias.zero_()
    router.bias_tokens_per_expert = torch.tensor([6, 0, 9, 1])
    router.update_expert_bias()
    torch.testing.assert_close(router.score_bias, torch.tensor([-0.01, 0.01, -0.01, 0.01]))
    assert router.bias_tokens_per_expert is None
    router.update_expert_bias()  # no tokens seen: all counts equal the mean, no change
    torch.testing.assert_close(router.score_bias, torch.tensor([-0.01, 0.01, -0.01, 0.01]))
    # no accumulation in eval mode or without grad
    router.eval()
    router(x)
    with torch.no_grad():
        router.train()
        router(x)
    assert router.bias_tokens_per_expert is None


def test_sort_by_expert_capacity_by_hand():
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])  # flat: 0 1 0 2 0 1 1 0
    order, counts, dropped = sort_by_expert(idx, 3)
    assert order.tolist() == [0, 2, 4, 7, 1, 5, 6, 3]
    assert counts.tolist() == [4, 3, 1] and dropped.item() == 0
    order, counts, dropped = sort_by_expert(idx, 3, capacity=2)
    assert order.tolist() == [0, 2, 1, 5, 3]  # earliest tokens kept per expert
    assert counts.tolist() == [2, 2, 1] and dropped.item() == 3
    assert expert_capacity(4, num_experts=3, top_k=2, capacity_factor=0.75) == 2


@pytest.mark.parametrize(
    "dtype,k,n,uses_grouped_mm",
    [(torch.float32, 8, 4, True), (torch.float32, 5, 3, False), (torch.float64, 8, 4, False)],
)
def test_grouped_matmul_matches_loop_and_gives_zero_grads_to_empty_groups(dtype, k, n, uses_grouped_mm):
    from olmx_plugins.layers.moe.modules import _grouped_mm_applies

    torch.manual_seed(3)
    x = torch.randn(7, k, dtype=dtype, requires_grad=True)
    w = torch.randn(4, k, n, dtype=dtype, requires_grad=True)
    assert _grouped_mm_applies(x, w) == uses_grouped_mm
    counts = torch.tensor([2, 0, 5, 0])
    y = grouped_matmul(x, w, counts)
    ref = torch.cat([x[:2] @ w[0], x[2:] @ w[2]])
    torch.testing.assert_close(y, ref)
    y.backward(torch.ones_like(y))
    assert w.grad is not None and w.grad[1].abs().sum() == 0 and w.grad[3].abs().sum() == 0
    torch.testing.assert_close(w.grad[0], x[:2].detach().T @ torch.ones(2, n, dtype=dtype))
    # no rows at all
    empty = grouped_matmul(x[:0], w, torch.zeros(4, dtype=torch.long))
    assert empty.shape == (0, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_dropless_equals_dense_computation_with_grads(dtype, gating):
    torch.manual_seed(4)
    moe = make_moe(gating=gating, normalize_expert_weights=1.0 if gating == "sigmoid" else None, dtype=dtype)
    x = torch.randn(2, 9, D, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 9, D, dtype=dtype)
    moe.eval()  # no aux losses here
    out = moe(x)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in moe.named_parameters()}
    xg = x.grad.clone()
    moe.zero_grad()
    x.grad = None
    ref, *_ = dense_reference(moe, x.reshape(-1, D))
    (ref.view_as(g) * g).sum().backward()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out, ref.view_as(out).to(dtype), **tol)
    torch.testing.assert_close(xg, x.grad, **tol)
    for n, p in moe.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, **tol, msg=n)


def test_capacity_drops_latest_assignments_and_counts_them():
    torch.manual_seed(5)
    moe = make_moe(top_k=2, capacity_factor=0.5)
    x = torch.randn(12, D)
    out = moe(x)  # training mode: metrics accumulate
    cap = expert_capacity(12, num_experts=E, top_k=2, capacity_factor=0.5)
    assert cap == 3
    _, _, _, idx = dense_reference(moe, x)
    counts = torch.bincount(idx.flatten(), minlength=E)
    # keep mask in (token, slot) order: an assignment survives if fewer than cap earlier ones
    seen = [0] * E
    keep = torch.zeros(12 * 2)
    for a, e in enumerate(idx.flatten().tolist()):
        keep[a] = float(seen[e] < cap)
        seen[e] += 1
    ref, *_ = dense_reference(moe, x, keep=keep)
    torch.testing.assert_close(out, ref)
    expected_dropped = int((counts - cap).clamp(min=0).sum())
    assert expected_dropped > 0 and int((1 - keep).sum()) == expected_dropped
    m = moe.compute_metrics()
    assert m["dropped_fraction"].item() == pytest.approx(expected_dropped / 24)
    assert torch.equal(m["tokens_per_expert"], counts.float())


def test_aux_loss_values_by_hand():
    scores = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.2, 0.5, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    counts = torch.tensor([2, 2, 1, 1])  # top-2 of 3 tokens
    # Switch: E * sum_e f_e P_e with f = counts / (N k), P = mean scores
    f = counts / 6
    P = scores.mean(0)
    expected = 4 * (f * P).sum()
    torch.testing.assert_close(load_balancing_loss(scores, counts, top_k=2), expected)
    torch.testing.assert_close(load_balancing_loss(scores, counts, top_k=2, loss_div_factor=6.0), expected / 2)
    uniform = torch.full((8, 4), 0.25)
    assert load_balancing_loss(uniform, torch.tensor([4, 4, 4, 4]), top_k=2).item() == pytest.approx(1.0)
    logits = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    lse = torch.tensor(
        [torch.log(torch.tensor(2.0)), torch.log(torch.exp(torch.tensor(1.0)) + torch.exp(torch.tensor(-1.0)))]
    )
    torch.testing.assert_close(router_z_loss(logits), (lse**2).mean())


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_weighted_aux_losses_enter_the_gradient(gating):
    torch.manual_seed(6)
    a, b, div = 0.3, 0.05, 40.0
    moe = make_moe(gating=gating, lb_loss_weight=a, z_loss_weight=b)
    x = torch.randn(18, D)
    g = torch.randn(18, D)
    (moe(x, loss_div_factor=div) * g).sum().backward()
    got = {n: p.grad.clone() for n, p in moe.named_parameters()}
    lb_val, z_val = moe.last_aux_losses["lb_loss"], moe.last_aux_losses["z_loss"]
    moe.zero_grad()
    ref, logits, scores, idx = dense_reference(moe, x)
    p = scores / scores.sum(-1, keepdim=True)
    counts = torch.bincount(idx.flatten(), minlength=E)
    lb = (E / 2) * (counts * p.mean(0)).sum() / div
    z = (torch.logsumexp(logits, -1) ** 2).sum() / div
    torch.testing.assert_close(lb_val, lb.detach())
    torch.testing.assert_close(z_val, z.detach())
    ((ref * g).sum() + a * lb + b * z).backward()
    for n, prm in moe.named_parameters():
        torch.testing.assert_close(got[n], prm.grad, msg=n)
    # the aux terms really changed the router gradient
    moe.zero_grad()
    ref2, *_ = dense_reference(moe, x)
    (ref2 * g).sum().backward()
    assert (moe.router.weight.grad - got["router.weight"]).abs().max() > 1e-4
    # no aux loss in eval mode
    moe.eval()
    moe.last_aux_losses = {}
    moe(x)
    assert moe.last_aux_losses == {}


@pytest.mark.parametrize("mixing", ["sum", "olmo_core_v1"])
def test_shared_expert_mixing(mixing):
    torch.manual_seed(7)
    moe = make_moe(shared_hidden_size=6, shared_expert_mixing=mixing).eval()
    x = torch.randn(5, D)
    routed, *_ = dense_reference(moe, x)
    s = moe.shared_expert
    shared = s.w2(F.silu(s.w1(x)) * s.w3(x))
    expected = routed + shared if mixing == "sum" else shared / 3 + routed * 2 / 3
    torch.testing.assert_close(moe(x), expected)


def test_seeded_init_is_deterministic_and_distinct_per_layer():
    a, b, c = make_moe(seed_key="blocks.0.moe"), make_moe(seed_key="blocks.0.moe"), make_moe(seed_key="blocks.1.moe")
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), n
        assert not torch.equal(pa, pc), n
    w = a.experts.w1
    assert not torch.equal(w[0], w[1])  # experts differ from each other
    assert w.abs().max() <= 3 * 0.3 + 1e-6 and w.std().item() == pytest.approx(0.3 * 0.88, rel=0.15)


def test_context_parallel_degree_rescales_aux_losses():
    torch.manual_seed(8)
    moe = make_moe(lb_loss_weight=1.0, z_loss_weight=1.0)
    x = torch.randn(6, D)
    moe(x, loss_div_factor=12.0)
    plain = dict(moe.last_aux_losses)
    moe.cp_degree = 3  # OLMo-core passes the CP group's token count; each rank divides by it / 3
    moe(x, loss_div_factor=12.0)
    for name, value in plain.items():
        torch.testing.assert_close(moe.last_aux_losses[name], value * 3)


def test_package_import_is_light():
    """Importing the plugin package must not import torch (plugin-load time rule)."""
    import subprocess
    import sys

    code = (
        "import sys, olmx_plugins.layers.moe as m; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'MoEBlockConfig' in m.__all__"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_experts_compute_in_the_autocast_dtype_and_keep_float32_gradients():
    """Under autocast (precision=bf16 without sharded parameters) the experts' grouped matmuls
    take bfloat16 operands, as autocast gives nn.Linear (grouped_mm's fast CUDA path needs
    them); the parameters and their gradients stay float32."""
    from olmx_plugins.layers.moe.modules import MoEExperts

    torch.manual_seed(0)
    experts = MoEExperts(4, 32, 64)
    x, counts = torch.randn(16, 32), torch.tensor([4, 4, 4, 4])
    ref = experts(x, counts)
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), experts.w1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = experts(x, counts)
    assert out.dtype == torch.bfloat16 and experts.w1.dtype == torch.float32
    (grad,) = torch.autograd.grad(out.float().square().sum(), experts.w1)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.02)
    torch.testing.assert_close(grad, ref_grad, rtol=0.1, atol=0.05 * ref_grad.abs().max().item())
