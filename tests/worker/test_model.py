"""olmx's model presets build exactly OLMo-core's configs, and the plan's parameter
counts (computed without torch) equal OLMo-core's."""

from __future__ import annotations

import pytest
import yaml

from olmx.config.compose import conf_dir
from olmx.config.schema import ModelConfig
from olmx.plan.resolve import count_params
from olmx.worker.model import build_model_config

PRESETS = sorted(p.stem for p in (conf_dir() / "model").glob("olmo3_*.yaml"))


def preset(name: str) -> ModelConfig:
    return ModelConfig(**yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text()))


def test_every_olmo3_preset_is_shipped():
    assert {"olmo3_190m", "olmo3_1b", "olmo3_7b"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_builds_olmo_core_config(name):
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    size = name.removeprefix("olmo3_").upper()
    ours = build_model_config(preset(name), vocab_size=100352)
    theirs = getattr(TransformerConfig, f"olmo3_{size}")(vocab_size=100352, attn_backend=AttentionBackendName.torch)
    assert ours.as_config_dict() == theirs.as_config_dict()
    assert count_params(preset(name), 100352).total == theirs.num_params


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"qk_norm": True, "block": "reordered_norm"}])
def test_param_count_matches_built_model(overrides):
    model = ModelConfig(**overrides)
    cfg = build_model_config(model, vocab_size=384)
    built = cfg.build(init_device="meta")
    counts = count_params(model, 384)
    assert counts.total == sum(p.numel() for p in built.parameters()) == cfg.num_params
    assert counts.embedding == 384 * model.d_model
