"""Engram under Ulysses: 2 gloo processes against the unsharded Engram model.

The Engram layer's n-gram hashes are computed on the whole sequence before sharding and its
dilated causal convolution reads the previous shard's halo; with both, loss and gradients
(tables included) equal the single-process ones. A negative control drops the halo.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.dist

SEQ, BATCH = 32, 2


def _engram_model():
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    from olmx_plugins.layers.engram.block import EngramBlockConfig, EngramConfig, apply_engram_inputs
    from olmx_plugins.layers.engram.compression import TokenizerCompression, byte_level_tokens

    # N = 3, kernel 4: the convolution reaches (4 - 1) * 3 = 9 positions back, the hashes 2.
    engram = EngramConfig(
        layer_ids=[1], n_embed_per_ngram=32, n_head_per_ngram=4, vocab_size_per_ngram=[500, 500], zero_init_conv=False
    )
    config = TransformerConfig.llama_like(
        d_model=64, vocab_size=384, n_layers=2, n_heads=4, n_kv_heads=1, attn_backend=AttentionBackendName.torch
    )
    base = config.block
    config.block = {
        "dense": base,
        "engram": EngramBlockConfig(
            sequence_mixer=base.sequence_mixer,
            layer_norm=base.layer_norm,
            feed_forward=base.feed_forward,
            name=base.name,
            engram=engram,
        ),
    }
    config.block_pattern = ["dense", "engram"]
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    comp = TokenizerCompression(byte_level_tokens())
    hasher = engram.build_hasher(pad_id=comp.canonical(257), compressed_vocab_size=comp.compressed_vocab_size)
    return apply_engram_inputs(model, compression=comp, hasher=hasher)


def _loss_and_grads(model, input_ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids, labels=labels, loss_reduction="sum", loss_div_factor=(labels != -100).sum())
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _check_engram():
    import copy

    import torch.distributed as dist
    import torch.nn.functional as F
    from olmo_core.nn.attention.ring import UlyssesContextParallelStyle
    from torch.distributed.device_mesh import init_device_mesh

    from olmx_plugins.parallel.ulysses_attention import apply_ulysses_attention

    degree = dist.get_world_size()
    cp_mesh = init_device_mesh("cpu", (degree,), mesh_dim_names=("cp",))["cp"]
    torch.manual_seed(1)
    input_ids = torch.randint(0, 256, (BATCH, SEQ))
    labels = F.pad(input_ids[:, 1:], (0, 1), value=-100)
    ref = _engram_model()
    ref_loss, ref_grads = _loss_and_grads(ref, input_ids, labels)
    model = copy.deepcopy(ref)
    apply_ulysses_attention(model)
    model.apply_cp(cp_mesh, uly=UlyssesContextParallelStyle())
    assert model.blocks["1"].engram.cp_group is not None
    loss, grads = _loss_and_grads(model, input_ids, labels)
    dist.all_reduce(loss)
    torch.testing.assert_close(loss / degree, ref_loss, rtol=1e-5, atol=1e-6)
    assert "blocks.1.engram.table.weight" in grads
    for key, grad in grads.items():
        dist.all_reduce(grad)
        torch.testing.assert_close(grad / degree, ref_grads[key], rtol=1e-4, atol=2e-6, msg=key)

    # Negative control: without the halo the second shard's first positions go wrong.
    model.blocks["1"].engram.cp_group = None
    loss, _ = _loss_and_grads(model, input_ids, labels)
    dist.all_reduce(loss)
    assert abs(float(loss / degree - ref_loss)) > 1e-4


def test_engram_model_under_ulysses_matches_single_process():
    from olmo_core.testing import run_distributed_test

    run_distributed_test(_check_engram, world_size=2, backend="gloo", start_method="spawn")
