"""Ulysses' all-to-alls under ``torch.compile`` (backend ``aot_eager``, 2 gloo processes):
olmx's exchange is traced whole (``fullgraph=True``, no graph break, forward and backward equal
eager), while OLMo-core's ``all_to_all_single_cp2hp`` (``torch.distributed.nn.functional``)
cannot be traced whole in torch 2.13 (without ``fullgraph`` its frame silently runs eagerly) --
the reason olmx has its own."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.dist


def _check() -> None:
    import torch._dynamo
    import torch.distributed as dist
    from olmo_core.distributed.parallel.context_parallel import all_to_all_single_cp2hp
    from torch._dynamo.utils import counters

    from olmx_plugins.parallel.ulysses_attention import heads_to_seq, seq_to_heads

    group, degree = dist.group.WORLD, dist.get_world_size()
    torch.manual_seed(dist.get_rank())
    x = torch.randn(2, 8, 4, 16, requires_grad=True)  # [B, N/P, H, d]

    def roundtrip(t: torch.Tensor) -> torch.Tensor:
        heads = seq_to_heads(t, group, degree)  # [B, N, H/P, d]
        return heads_to_seq(heads * heads.sum(dim=1, keepdim=True), group, degree)

    eager = roundtrip(x)
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), x)
    assert seq_to_heads(x, group, degree).shape == (2, 16, 2, 16)
    assert torch.equal(heads_to_seq(seq_to_heads(x, group, degree), group, degree), x)  # inverse

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(roundtrip, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(grad, eager_grad)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # the same layout through OLMo-core's exchange cannot be traced whole
    torch._dynamo.reset()
    try:
        torch.compile(lambda t: all_to_all_single_cp2hp(t, group), backend="aot_eager", fullgraph=True)(x)
    except Exception as exc:  # noqa: BLE001 - dynamo's Unsupported / its wrapper, by version
        assert "Unsupported" in type(exc).__name__ or "graph break" in str(exc).lower() or "skip" in str(exc).lower(), (
            exc
        )
    else:
        raise AssertionError("OLMo-core's all-to-all now traces whole; olmx's own exchange may be unneeded")


def test_ulysses_all_to_all_compiles_without_graph_breaks():
    from olmo_core.testing import run_distributed_test

    run_distributed_test(_check, world_size=2, backend="gloo", start_method="spawn")
