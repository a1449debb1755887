"""The portable MoE block inside a real OLMo-core model (single process)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from moe_testing import tiny_moe_model_config
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

from olmx_plugins.layers.moe.block import MoEBlock, MoEBlockConfig, MoEFeedForwardConfig
from olmx_plugins.layers.moe.convert import v1_state_dict_to_portable
from olmx_plugins.layers.moe.modules import moe_layers


def _batch(seed: int = 0):
    ids = torch.randint(0, 384, (4, 16), generator=torch.Generator().manual_seed(seed))
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = -100
    return ids, labels


@pytest.mark.parametrize("name", [TransformerBlockType.default, TransformerBlockType.reordered_norm])
def test_tiny_model_builds_counts_params_and_trains(name):
    cfg = tiny_moe_model_config(bias_gamma=0.01)
    cfg.block["moe"].name = name
    model = cfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    block = model.blocks["1"]
    assert isinstance(block, MoEBlock) and block.reordered_norm == (name == TransformerBlockType.reordered_norm)
    assert not hasattr(block, "feed_forward") and not hasattr(block, "feed_forward_moe")

    n_model = sum(p.numel() for p in model.parameters())
    assert cfg.num_params == n_model == model.num_params
    # active: the MoE block uses top_k=2 of the 4 experts (3 * 64 * 32 params each)
    assert cfg.num_params - cfg.num_active_params == 2 * 3 * 64 * 32

    moe = block.moe
    attn_flops = block.attention.num_flops_per_token(16)
    assert block.num_flops_per_token(16) == attn_flops + 6 * (4 * 64 + 2 * 3 * 64 * 32 + 3 * 64 * 32)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, labels = _batch()
    losses = []
    for _ in range(6):
        opt.zero_grad()
        out = model(ids, labels=labels, loss_reduction="sum", loss_div_factor=(labels != -100).sum())
        out.loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        assert moe.router.weight.grad.abs().sum() > 0 and moe.experts.w2.grad.abs().sum() > 0
        for layer in moe_layers(model):
            layer.update_expert_bias()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    assert moe.router.score_bias.abs().sum() > 0  # aux-loss-free bias moved
    metrics = moe.compute_metrics()
    assert metrics["tokens_per_expert"].sum() == 6 * 64 * 2
    assert metrics["load_imbalance"] >= 1.0 and {"lb_loss", "z_loss"} <= set(metrics)


def test_meta_build_then_init_weights_equals_cpu_build():
    cfg = tiny_moe_model_config()
    a = cfg.build(init_device="cpu")
    a.init_weights(device=torch.device("cpu"))
    b = cfg.build(init_device="meta")
    b.init_weights(device=torch.device("cpu"))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    ids, labels = _batch(1)
    torch.testing.assert_close(a(ids, labels=labels).loss, b(ids, labels=labels).loss)


def test_config_round_trip_and_validation():
    cfg = tiny_moe_model_config(gating="sigmoid", capacity_factor=1.25)
    data = cfg.as_config_dict()
    assert data["block"]["moe"]["_CLASS_"] == "olmx_plugins.layers.moe.block.MoEBlockConfig"
    again = TransformerConfig.from_dict(data)
    assert again == cfg and isinstance(again.block["moe"].moe, MoEFeedForwardConfig)
    # dotted overrides reach the named block
    assert cfg.merge(["block.moe.moe.top_k=1"]).block["moe"].moe.top_k == 1

    # The block's own structure is checked here; the MoE settings (top_k, gating, ...) once, at
    # plan time (test_moe_plugin.py::test_moe_refusals).
    moe_block = cfg.block["moe"]
    with pytest.raises(OLMoConfigurationError, match="feed_forward"):
        dataclasses.replace(moe_block, feed_forward=FeedForwardConfig(hidden_size=8)).num_params(64)
    with pytest.raises(OLMoConfigurationError, match="name"):
        dataclasses.replace(moe_block, name=TransformerBlockType.moe).num_params(64)
    with pytest.raises(NotImplementedError):
        MoEBlockConfig.from_dense(cfg.block["dense"], moe=MoEFeedForwardConfig(hidden_size=32)).build(
            d_model=64, block_idx=0, n_layers=1
        ).apply_tp(None, input_layout=None)


@pytest.mark.parametrize("dropless", [False, True])
def test_olmo_core_v1_checkpoint_maps_onto_portable_layer(dropless):
    """OLMo-core v1's router and expert MLPs run on CPU on their own (only its token
    permutation needs Triton), so each part is compared after converting the state dict."""
    from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoEType

    torch.manual_seed(0)
    d, h, E, N = 16, 24, 4, 5
    v1 = MoEConfig(
        name=MoEType.dropless if dropless else MoEType.default,
        num_experts=E,
        hidden_size=h,
        capacity_factor=None if dropless else 1.5,
        router=MoERouterConfig(top_k=2, bias_gamma=0.01),
        shared_mlp=FeedForwardConfig(hidden_size=8, bias=False),
    ).build(d_model=d)
    with torch.no_grad():
        for p in v1.parameters():
            p.normal_(0, 0.2)
        v1.router.score_bias.normal_()
    ours = MoEFeedForwardConfig(
        num_experts=E,
        top_k=2,
        hidden_size=h,
        shared_hidden_size=8,
        bias_gamma=0.01,
        shared_expert_mixing="olmo_core_v1",
    ).build(d)
    ours.load_state_dict(
        v1_state_dict_to_portable(v1.state_dict(), num_experts=E, d_model=d, hidden_size=h, dropless=dropless)
    )
    x = torch.randn(E * N, d)
    torch.testing.assert_close(ours.router(x).logits, v1.router.get_expert_logits(x))
    torch.testing.assert_close(ours.router.score_bias, v1.router.score_bias)
    torch.testing.assert_close(ours.shared_expert(x), v1.shared_mlp(x))
    counts = torch.full((E,), N)
    if dropless:
        expected = v1.experts.mlp(x, counts)
    else:
        expected = v1.experts.mlp(x.view(E, N, d)).reshape(E * N, d)
    torch.testing.assert_close(ours.experts(x, counts), expected)
