"""Engram in a tiny OLMo-core model: build, hashes reach the blocks, forward/backward."""

import pytest
import torch
from olmo_core.config import Config
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from olmo_core.nn.transformer.block import TransformerBlock

from olmx_plugins.layers.engram.block import (
    ENGRAM_HASH_IDS_KWARG,
    TABLE_PARAM_PATTERN,
    EngramBlockConfig,
    EngramConfig,
    EngramTransformer,
    apply_engram_inputs,
)
from olmx_plugins.layers.engram.compression import TokenizerCompression, byte_level_tokens

ENGRAM = dict(layer_ids=[1], n_embed_per_ngram=32, n_head_per_ngram=4, vocab_size_per_ngram=[500, 500])


def tiny_config(engram: EngramConfig, block_name=TransformerBlockType.default) -> TransformerConfig:
    cfg = TransformerConfig.llama_like(
        d_model=64,
        vocab_size=384,
        n_layers=2,
        n_heads=4,
        attn_backend=AttentionBackendName.torch,
        block_name=block_name,
    )
    base = cfg.block
    mem = EngramBlockConfig(
        sequence_mixer=base.sequence_mixer,
        layer_norm=base.layer_norm,
        feed_forward=base.feed_forward,
        name=base.name,
        engram=engram,
    )
    cfg.block = {"dense": base, "engram": mem}
    cfg.block_pattern = ["dense", "engram"]
    return cfg


def build_model(engram: EngramConfig, init_device="meta", **kwargs):
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    model = tiny_config(engram, **kwargs).build(init_device=init_device)
    model.init_weights(device=torch.device("cpu"))
    hasher = engram.build_hasher(pad_id=comp.canonical(257), compressed_vocab_size=comp.compressed_vocab_size)
    return apply_engram_inputs(model, compression=comp, hasher=hasher), comp, hasher


@pytest.mark.parametrize("block_name", [TransformerBlockType.default, TransformerBlockType.reordered_norm])
def test_tiny_model_builds_runs_and_blocks_receive_hashes(block_name):
    torch.manual_seed(0)
    engram = EngramConfig(**ENGRAM)
    cfg = tiny_config(engram, block_name)
    model, comp, hasher = build_model(engram, block_name=block_name)
    assert isinstance(model, EngramTransformer)
    assert model.num_params == cfg.num_params
    block = model.blocks["1"]
    assert type(block).__name__.startswith("Engram") and not hasattr(model.blocks["0"], "engram")
    # Built on meta and initialised the OLMo-core way: the convolution stays zero.
    assert bool((block.engram.conv_weight == 0).all())

    seen = {}
    block.engram.register_forward_hook(lambda m, args, out: seen.update(hash_ids=args[1]))
    input_ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    out = model(input_ids, labels=input_ids)
    assert torch.equal(seen["hash_ids"], hasher.hash(comp.compress(input_ids), 1))
    out.loss.backward()
    table = block.engram.table
    touched = table.rows(seen["hash_ids"]).unique()
    assert torch.equal(table.weight.grad.abs().sum(1).nonzero().flatten(), touched)
    assert block.attention.w_q.weight.grad is not None
    assert model.embeddings.weight.grad.abs().sum() > 0


def test_engram_changes_the_output_and_is_added_before_attention():
    torch.manual_seed(0)
    model, comp, hasher = build_model(EngramConfig(**ENGRAM), init_device="cpu")
    block = model.blocks["1"]
    x = torch.randn(2, 10, 64)
    ids = torch.randint(0, 256, (2, 10))
    hash_ids = hasher.hash(comp.compress(ids), 1)
    out = block(x, **{ENGRAM_HASH_IDS_KWARG: hash_ids})
    base_forward = TransformerBlock.forward
    expected = base_forward(block, x + block.engram(x, hash_ids))
    assert torch.equal(out, expected)
    assert not torch.allclose(out, base_forward(block, x))
    with pytest.raises(RuntimeError, match=ENGRAM_HASH_IDS_KWARG):
        block(x)


def test_table_parameters_match_the_documented_pattern():
    from fnmatch import fnmatch

    model, _, _ = build_model(EngramConfig(**ENGRAM), init_device="cpu")
    names = [n for n, _ in model.named_parameters() if fnmatch(n, TABLE_PARAM_PATTERN)]
    assert names == ["blocks.1.engram.table.weight"]


def test_config_round_trip_and_validation():
    cfg = tiny_config(EngramConfig(**ENGRAM))
    again = Config.from_dict(cfg.as_config_dict())
    assert again == cfg
    assert isinstance(again.block["engram"], EngramBlockConfig)
    # The settings are validated once, at plan time (test_engram_plugin.py::test_refusals); the
    # derived EngramConfig checks only how its blocks were placed.
    with pytest.raises(OLMoConfigurationError, match="not in engram.layer_ids"):
        tiny_config(EngramConfig(**{**ENGRAM, "layer_ids": [0]})).build(init_device="meta")


def test_apply_engram_inputs_checks_layers():
    engram = EngramConfig(**ENGRAM)
    model = tiny_config(engram).build(init_device="meta")
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    other = EngramConfig(**{**ENGRAM, "layer_ids": [0, 1]})
    hasher = other.build_hasher(pad_id=0, compressed_vocab_size=comp.compressed_vocab_size)
    with pytest.raises(OLMoConfigurationError):
        apply_engram_inputs(model, compression=comp, hasher=hasher)


def test_tensor_and_context_parallel_are_refused():
    model, _, _ = build_model(EngramConfig(**ENGRAM))
    with pytest.raises(NotImplementedError, match="context parallelism"):
        model.blocks["1"].apply_cp(None)
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        model.blocks["1"].apply_tp(None, input_layout=None)
