"""Emulated MXFP8 linear layers against float32: an independent MX reference and a derived bound.

The bound (OCP MX v1.0; E4M3 has 3 mantissa bits, a smallest normal of 2^-6 and subnormal
steps of 2^-9): quantizing one element x of a block with scale s costs at most

    |q(x) - x| <= eps * |x| + 2^-10 * s,

with eps = 2^-4 (round to nearest in the normal range) and 2^-10 * s for the subnormal range.
``rceil`` picks s = 2^ceil(log2(amax/448)), so nothing saturates and s < 2 * amax / 448.
``floor`` picks s = 2^(floor(log2 amax) - 8), so amax / s lies in [256, 512) and elements above
448 * s saturate, losing up to (512 - 448) / 512 = 2^-3 of their value: eps = 2^-3, s <= amax / 256.
For a product of two quantized operands summed over k,

    |sum_k q(a_k) q(b_k) - a_k b_k| <= sum_k (da_k |b_k| + |a_k| db_k + da_k db_k),

where da_k, db_k are the per-element bounds above, with each operand blocked along k (the
contraction dimension of that GEMM: in_features, out_features or tokens).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from olmx_plugins.precision.mx import ao_mx_config
from olmx_plugins.precision.mxfp8 import MXFP8Config

E4M3_MAX = 448.0
SUBNORMAL_HALF_STEP = 2.0**-10
EPS = {"rceil": 2.0**-4, "floor": 2.0**-3}


def mx_linear(linear: nn.Linear, mode: str) -> nn.Linear:
    from torchao.quantization import quantize_

    quantize_(linear, ao_mx_config(MXFP8Config(scale_calculation_mode=mode), emulate=True).to_ao_type())
    return linear


def blocks(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K/32, 32]."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)


def reference_quantize(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Independent MXFP8 round trip along the last dim: power-of-two block scales, E4M3 elements."""
    xb = blocks(x)
    amax = xb.abs().amax(-1, keepdim=True)
    if mode == "rceil":
        exp = torch.ceil(torch.log2(amax / E4M3_MAX))
    else:
        exp = torch.floor(torch.log2(amax)) - 8
    scale = torch.exp2(exp)
    q = (xb / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale
    return q.reshape(x.shape)


def element_bound(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-element bound on |q(x) - x| for blocks along the last dim (module docstring)."""
    amax = blocks(x).abs().amax(-1, keepdim=True)
    scale_max = 2 * amax / E4M3_MAX if mode == "rceil" else amax / 256
    return (EPS[mode] * blocks(x).abs() + SUBNORMAL_HALF_STEP * scale_max).reshape(x.shape)


def gemm_bound(a: torch.Tensor, b: torch.Tensor, mode: str) -> torch.Tensor:
    """Bound on |q(a) @ q(b)^T - a @ b^T| for a [m, k], b [n, k], both blocked along k."""
    da, db = element_bound(a, mode), element_bound(b, mode)
    return da @ b.abs().T + a.abs() @ db.T + da @ db.T


def layer_and_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ref = nn.Linear(128, 96, bias=False)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(96, 128, generator=g) * 0.05)
    # Heavy-tailed activations (a few large outliers), as in transformers.
    x = torch.randn(64, 128, generator=g) * torch.exp(torch.randn(64, 128, generator=g))
    dy = torch.randn(64, 96, generator=g)
    return ref, x, dy


def forward_backward(layer: nn.Linear, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad


@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_emulated_mx_linear_matches_an_independent_mx_reference(mode):
    ref, x, dy = layer_and_data()
    w = ref.weight.detach().clone()
    mx = mx_linear(nn.Linear(128, 96, bias=False), mode)
    with torch.no_grad():
        mx.weight.copy_(w)
    y, dx, dw = forward_backward(mx, x, dy)
    q = lambda t: reference_quantize(t.contiguous(), mode)  # noqa: E731
    # output: X and W along in_features; grad_input: dY and W^T along out_features;
    # grad_weight: dY^T and X^T along tokens.
    torch.testing.assert_close(y, q(x) @ q(w).T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, q(dy) @ q(w.T).T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, q(dy.T) @ q(x.T).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_emulated_mx_linear_is_within_the_fp8_block_scaled_error_bound(mode):
    ref, x, dy = layer_and_data(1)
    mx = mx_linear(nn.Linear(128, 96, bias=False), mode)
    with torch.no_grad():
        mx.weight.copy_(ref.weight)
    w = ref.weight.detach()
    y_ref, dx_ref, dw_ref = forward_backward(ref, x, dy)
    y, dx, dw = forward_backward(mx, x, dy)
    for got, want, bound in (
        (y, y_ref, gemm_bound(x, w, mode)),
        (dx, dx_ref, gemm_bound(dy, w.T.contiguous(), mode)),
        (dw, dw_ref, gemm_bound(dy.T.contiguous(), x.T.contiguous(), mode)),
    ):
        err = (got - want).abs()
        assert (err <= bound * (1 + 1e-4) + 1e-6).all(), f"max err/bound {(err / bound).max():.3f}"
        # On average the rounding errors are far below the worst case and largely cancel ...
        assert err.mean() < 0.15 * bound.mean()
        # ... but they are FP8-sized: much coarser than bf16 (8 mantissa bits), so MX really ran.
        rel = err.norm() / want.norm()
        assert 1e-2 < rel < 6e-2, rel


def test_mx_tensor_layout_is_e4m3_elements_with_one_e8m0_scale_per_32():
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    x = torch.randn(4, 96)
    t = MXTensor.to_mx(x, torch.float8_e4m3fn, 32)
    assert t.qdata.dtype == torch.float8_e4m3fn and t.qdata.shape == (4, 96)
    assert t.scale.dtype == torch.float8_e8m0fnu and t.scale.shape == (4, 3)
