"""Shared by the MoE tests: the tiny OLMo-core model with one dense and one MoE block."""

from __future__ import annotations

import dataclasses

from olmx_plugins.layers.moe.block import MoEBlockConfig, MoEFeedForwardConfig


def tiny_moe_model_config(**moe_kw):
    """``llama_like`` (d_model 64, 2 layers, vocab 384, torch attention), blocks dense + MoE."""
    from olmo_core.nn.transformer import TransformerConfig

    base = TransformerConfig.llama_like(d_model=64, vocab_size=384, n_layers=2, n_heads=4, attn_backend="torch")
    moe = MoEFeedForwardConfig(
        **{
            **dict(
                num_experts=4,
                top_k=2,
                hidden_size=32,
                shared_hidden_size=32,
                lb_loss_weight=0.01,
                z_loss_weight=0.001,
                init_std=0.05,
            ),
            **moe_kw,
        }
    )
    return dataclasses.replace(
        base,
        block={"dense": base.block, "moe": MoEBlockConfig.from_dense(base.block, moe=moe)},
        block_pattern=["dense", "moe"],
    )
