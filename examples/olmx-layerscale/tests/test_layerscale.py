"""Tests of olmx-layerscale: the plugin contract, the presets, the LayerScale arithmetic, and the
edit of a real (tiny) OLMo-core model: initialisation, forward, parameters, optimizer groups."""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from types import SimpleNamespace

import pytest
import yaml
from olmx_layerscale.plugin import LAYERSCALE, LayerScaleConfig, chosen_blocks
from packaging.specifiers import SpecifierSet

import olmx
from olmx.api import LayerPlugin, World
from olmx.errors import ConfigError

WORLD = World(nnodes=1, nproc_per_node=2)


def run_of(n_layers: int = 4, d_model: int = 64) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(n_layers=n_layers, d_model=d_model))


def ctx_of(run: SimpleNamespace) -> SimpleNamespace:
    """What ``resolve`` reads of olmx's :class:`olmx.api.Context` (the run and the world)."""
    return SimpleNamespace(run=run, world=WORLD)


def preset(name: str) -> dict:
    return yaml.safe_load((files("olmx_layerscale.conf") / "layers" / f"{name}.yaml").read_text())


def test_it_is_a_layer_plugin():
    assert isinstance(LAYERSCALE, LayerPlugin)
    assert LAYERSCALE.name == "layerscale"
    assert olmx.PLUGIN_API in SpecifierSet(LAYERSCALE.api)


def test_the_presets_are_complete_configs():
    assert preset("layerscale") == {"layerscale": dataclasses.asdict(LayerScaleConfig())}
    deep = preset("layerscale_deep")["layerscale"]
    assert set(deep) == {f.name for f in dataclasses.fields(LayerScaleConfig)}
    assert deep["init"] == 1e-6


def test_blocks_are_chosen_by_every_or_by_index():
    assert chosen_blocks(LayerScaleConfig(), 4) == [0, 1, 2, 3]
    assert chosen_blocks(LayerScaleConfig(every=3), 7) == [0, 3, 6]
    assert chosen_blocks(LayerScaleConfig(every=3, blocks=[5, 1, 5]), 7) == [1, 5]


def test_resolve_counts_the_added_parameters():
    c = LAYERSCALE.resolve(LayerScaleConfig(every=2), ctx_of(run_of(n_layers=4, d_model=64)))
    assert c.params == c.active_params == 2 * 2 * 64
    assert ("blocks", "0, 2 (every 2, of 4)") in c.rows
    c = LAYERSCALE.resolve(LayerScaleConfig(blocks=[3], branches=["feed_forward"]), ctx_of(run_of()))
    assert c.params == 64


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (LayerScaleConfig(every=0), "layers.layerscale.every: must be a positive integer, got 0"),
        (LayerScaleConfig(blocks=[1, 4, 9]), r"layers.layerscale.blocks: \[4, 9\] outside \[0, model.n_layers=4\)"),
        (LayerScaleConfig(blocks=[]), "layers.layerscale.blocks: is empty"),
        (LayerScaleConfig(branches=["mlp"]), "layers.layerscale.branches: .* among attention, feed_forward"),
        (LayerScaleConfig(init=float("nan")), "layers.layerscale.init: must be a finite number"),
        (LayerScaleConfig(weight_decay=-1.0), "layers.layerscale.weight_decay: must be >= 0"),
    ],
)
def test_resolve_rejects_bad_settings(cfg, message):
    with pytest.raises(ConfigError, match=message):
        LAYERSCALE.resolve(cfg, ctx_of(run_of()))


def test_the_stream_adds_the_scaled_branch_and_learns_its_scale():
    import torch
    from olmx_layerscale.modules import LayerScaleResidualStream

    torch.manual_seed(0)
    stream = LayerScaleResidualStream(8, init=0.5, alpha=2.0)
    residual, branch = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    out = stream(residual, branch)
    torch.testing.assert_close(out, residual + 2.0 * 0.5 * branch)
    out.pow(2).sum().backward()
    # d/d scale_c of sum (r + a s x)^2 = sum over tokens of 2 (r + a s x) a x_c
    expected = (2 * (residual + 2.0 * 0.5 * branch) * 2.0 * branch).sum(dim=(0, 1))
    torch.testing.assert_close(stream.scale.grad, expected)


def tiny_model(n_layers: int = 3, d_model: int = 32, block: str = "default"):
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    return TransformerConfig.llama_like(
        d_model=d_model, vocab_size=128, n_layers=n_layers, n_heads=4, block_name=TransformerBlockType(block)
    ).build(init_device="meta")


@pytest.mark.parametrize("block", ["default", "reordered_norm"])
def test_apply_model_edits_the_chosen_blocks_of_a_real_model(block):
    import torch
    from olmx_layerscale.modules import LayerScaleResidualStream

    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    outputs = {}
    for init in (None, 1.0, 0.1):
        model = tiny_model(block=block)
        cfg = LayerScaleConfig(init=init or 1.0, every=2)
        if init is not None:
            LAYERSCALE.apply_model(cfg, model, plan=None)
        model.init_weights(max_seq_len=16, device=torch.device("cpu"))
        outputs[init] = model(tokens)
        if init is None:
            base_params = sum(p.numel() for p in model.parameters())
            continue
        names = {n for n, _ in model.named_parameters() if n.endswith(".scale")}
        assert names == {f"blocks.{i}.{b}_residual_stream.scale" for i in (0, 2) for b in ("attention", "feed_forward")}
        assert isinstance(model.blocks["0"].feed_forward_residual_stream, LayerScaleResidualStream)
        assert not isinstance(model.blocks["1"].feed_forward_residual_stream, LayerScaleResidualStream)
        assert all(torch.equal(p, torch.full((32,), init)) for n, p in model.named_parameters() if n in names)
        added = sum(p.numel() for p in model.parameters()) - base_params
        assert added == LAYERSCALE.resolve(cfg, ctx_of(run_of(n_layers=3, d_model=32))).params == 4 * 32
    # Scales of 1 leave the model's function unchanged (same init seed); 0.1 changes it.
    assert torch.equal(outputs[1.0], outputs[None])
    assert not torch.allclose(outputs[0.1], outputs[None], atol=1e-3)


def test_a_block_without_the_stream_is_refused():
    model = tiny_model()
    LAYERSCALE.apply_model(LayerScaleConfig(blocks=[1]), model, plan=None)
    with pytest.raises(ConfigError, match="block 1 .* has no plain attention residual stream"):
        LAYERSCALE.apply_model(LayerScaleConfig(blocks=[1]), model, plan=None)


def test_the_scales_get_their_own_optimizer_group():
    import torch
    from olmo_core.optim import AdamWConfig

    model = tiny_model()
    cfg = LayerScaleConfig(blocks=[0, 2], weight_decay=0.0)
    LAYERSCALE.apply_model(cfg, model, plan=None)
    model.init_weights(max_seq_len=16, device=torch.device("cpu"))
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    config = TransformerTrainModuleConfig(
        rank_microbatch_size=16, max_sequence_length=16, optim=AdamWConfig(lr=1e-3, weight_decay=0.1)
    )
    names = tuple(n for n, _ in model.named_parameters())
    groups = LAYERSCALE.apply_train_module(cfg, config, None, names).optim.build(model).param_groups
    scales = {id(p) for n, p in model.named_parameters() if n.endswith(".scale")}
    assert len(scales) == 4
    assert [g["weight_decay"] for g in groups] == [0.0, 0.1]
    assert {id(p) for p in groups[0]["params"]} == scales
