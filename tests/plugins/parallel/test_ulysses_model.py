"""Ulysses at the OLMo-core model level: 2 real gloo processes against the unsharded model.

Each process builds the same tiny OLMo-core transformer twice from one seed: a reference
(single-device) and a Ulysses copy (olmx's attention wrapper + OLMo-core's context-parallel
input/label/RoPE sharding over a 2-rank group). Both see the same full batch; the Ulysses
copy shards it itself. Loss (summed over ranks) and gradients (all-reduced, divided by the
degree, as OLMo-core's data-parallel reduction over ``dp_cp`` does) must match the reference
up to float32 reordering.
"""

from __future__ import annotations

import pytest
import torch

from olmx_plugins.parallel.ulysses import replicated_kv_heads

pytestmark = pytest.mark.dist

#: (name, n_heads, n_kv_heads, sliding window of layer 0 or None, attention sinks)
CASES = [
    ("mha", 4, 4, None, False),
    ("gqa", 4, 2, None, False),
    ("mqa", 4, 1, None, False),  # fewer kv heads than ranks: replicated
    ("gqa_kv3", 6, 3, None, False),  # kv heads not divisible by the degree: lcm(3, 2) = 6
    ("sliding_window", 4, 2, 8, False),
    ("sinks", 4, 2, None, True),
]
SEQ, BATCH, VOCAB = 32, 2, 64


def _tiny(n_heads: int, n_kv_heads: int, window: int | None, sinks: bool):
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.transformer import TransformerConfig

    sliding = None
    if window is not None:
        sliding = SlidingWindowAttentionConfig(
            pattern=[window], force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=True
        )
    config = TransformerConfig.llama_like(
        d_model=48, vocab_size=VOCAB, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, sliding_window=sliding
    )
    if sinks:
        config.block.sequence_mixer.attention_sinks = True
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"), max_seq_len=SEQ)
    if sinks:  # sinks start at zero; make them matter
        with torch.no_grad():
            for block in model.blocks.values():
                block.attention.sinks.normal_()
    return model


def _loss_and_grads(model, input_ids, labels):
    model.zero_grad(set_to_none=True)
    n_tokens = (labels != -100).sum()
    out = model(input_ids, labels=labels, loss_reduction="sum", loss_div_factor=n_tokens)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _check_all_cases():
    import copy

    import torch.distributed as dist
    import torch.nn.functional as F
    from olmo_core.nn.attention.ring import UlyssesContextParallelStyle
    from torch.distributed.device_mesh import init_device_mesh

    from olmx_plugins.parallel.ulysses_attention import UlyssesAttention, apply_ulysses_attention

    degree = dist.get_world_size()
    cp_mesh = init_device_mesh("cpu", (degree,), mesh_dim_names=("cp",))["cp"]
    torch.manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = F.pad(input_ids[:, 1:], (0, 1), value=-100)  # shifted on the full sequence
    labels[0, 5:9] = -100  # some ignored tokens, all in rank 0's shard
    for name, n_heads, n_kv, window, sinks in CASES:
        ref = _tiny(n_heads, n_kv, window, sinks)
        ref_loss, ref_grads = _loss_and_grads(ref, input_ids, labels)

        model = copy.deepcopy(ref)
        assert apply_ulysses_attention(model) == 2
        model.apply_cp(cp_mesh, uly=UlyssesContextParallelStyle())
        wrapper = model.blocks["0"].attention.backend
        assert isinstance(wrapper, UlyssesAttention)
        assert wrapper.kv_repeat == replicated_kv_heads(n_kv, degree) // n_kv
        assert wrapper.window_size == ref.blocks["0"].attention.backend.window_size  # delegated
        loss, grads = _loss_and_grads(model, input_ids, labels)

        dist.all_reduce(loss)  # each rank: degree * (its shard's summed loss) / all tokens
        loss /= degree
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6, msg=f"{name}: loss")
        for key, grad in grads.items():
            dist.all_reduce(grad)
            grad /= degree
            torch.testing.assert_close(grad, ref_grads[key], rtol=1e-4, atol=2e-6, msg=f"{name}: grad {key}")

    # Negative controls: OLMo-core 3.0.0's own Ulysses path (no wrapper) fails on the
    # layouts the wrapper exists for.
    for name, n_heads, n_kv, window, sinks, error in [
        ("mqa", 4, 1, None, False, "is invalid for input of size"),
        ("sliding_window", 4, 2, 8, False, "must match"),
        ("sinks", 4, 2, None, True, "must match"),
    ]:
        native = _tiny(n_heads, n_kv, window, sinks)
        native.apply_cp(cp_mesh, uly=UlyssesContextParallelStyle())
        try:
            native(input_ids, labels=labels)
        except RuntimeError as exc:
            assert error in str(exc), f"{name}: {exc}"
        else:
            raise AssertionError(f"OLMo-core's own Ulysses path now runs '{name}'; revisit ulysses_attention.py")


def _check_halo():
    """A causal dilated depthwise convolution (Engram's short convolution: kernel 4,
    dilation 3) over sequence shards plus the previous shard's halo equals the unsharded one,
    values and gradients."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from olmx.worker.halo import previous_shard_halo

    rank, degree = dist.get_rank(), dist.get_world_size()
    kernel, dilation, channels = 4, 3, 5
    halo = (kernel - 1) * dilation
    torch.manual_seed(2)
    x = torch.randn(BATCH, SEQ, channels, requires_grad=True)
    weight = torch.randn(channels, 1, kernel, requires_grad=True)
    cotangent = torch.randn(BATCH, SEQ, channels)

    def conv(inp, left):
        y = F.pad(inp.transpose(1, 2), (left, 0))
        return F.conv1d(y, weight, groups=channels, dilation=dilation).transpose(1, 2)

    (conv(x, halo) * cotangent).sum().backward()
    ref_x_grad, ref_w_grad = x.grad.clone(), weight.grad.clone()
    weight.grad = None
    shard = slice(rank * SEQ // degree, (rank + 1) * SEQ // degree)
    local = x.detach()[:, shard].clone().requires_grad_()
    y = conv(torch.cat([previous_shard_halo(local, halo, dist.group.WORLD), local], dim=1), 0)
    torch.testing.assert_close(y, conv(x, halo)[:, shard].detach(), rtol=0, atol=1e-6)
    (y * cotangent[:, shard]).sum().backward()
    torch.testing.assert_close(local.grad, ref_x_grad[:, shard], rtol=1e-5, atol=1e-6)
    dist.all_reduce(weight.grad)
    torch.testing.assert_close(weight.grad, ref_w_grad, rtol=1e-5, atol=1e-5)


def _check_model_and_halo():
    _check_all_cases()
    _check_halo()


def test_loss_and_gradients_match_single_process_for_mha_gqa_mqa_swa_and_sinks():
    """Also checks the halo exchange that token-local layers (Engram's convolution) need."""
    from olmo_core.testing import run_distributed_test

    run_distributed_test(_check_model_and_halo, world_size=2, backend="gloo", start_method="spawn")


def test_kv_replication_keeps_every_query_head_on_its_kv_head():
    """Pure index check of the replication rule for many layouts (no processes)."""
    for n_heads in (4, 6, 8, 12, 16, 32):
        for n_kv in (h for h in range(1, n_heads + 1) if n_heads % h == 0):
            for degree in (d for d in (1, 2, 3, 4, 8) if n_heads % d == 0):
                m = replicated_kv_heads(n_kv, degree)
                assert m % degree == 0 and n_heads % m == 0 and m % n_kv == 0
                original = torch.arange(n_kv).repeat_interleave(m // n_kv)  # replicated -> original
                for rank in range(degree):
                    q_heads = range(rank * n_heads // degree, (rank + 1) * n_heads // degree)
                    kv_local = original[rank * m // degree : (rank + 1) * m // degree]
                    group = n_heads // degree // len(kv_local)  # the backend's n_rep on this rank
                    for j, q in enumerate(q_heads):
                        assert kv_local[j // group] == q // (n_heads // n_kv)
