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


def test_init_builds_no_attention_mask_that_full_causal_attention_never_reads():
    """OLMo-core's init warms each torch backend's mask cache with an S x S bool mask (2 S^2
    bytes at once); olmx skips it where SDPA runs with ``is_causal``. Layers with a sliding
    window or sinks still build theirs, and all give the same output as before the change."""
    from unittest import mock

    import torch
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    from olmx.worker.model import skip_unused_mask_warmup

    seq = 64
    cfg = build_model_config(ModelConfig(d_model=32, n_layers=3, n_heads=2, sliding_window=[16, -1]), vocab_size=384)
    built: list[tuple[int, int]] = []
    real = TorchAttentionBackend._build_sliding_window_mask.__func__

    def counting(cls, *, seq_len_q, seq_len_kv, device, window_size):
        built.append((seq_len_q, window_size[0]))
        return real(cls, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, device=device, window_size=window_size)

    ids = torch.randint(0, 384, (2, seq))
    outputs = []
    for skip in (False, True):
        torch.manual_seed(0)
        model = cfg.build(init_device="cpu")
        if skip:
            assert skip_unused_mask_warmup(model) == 2  # layers 1 and 2 attend fully; layer 0 has a window
        built.clear()
        with mock.patch.object(TorchAttentionBackend, "_build_sliding_window_mask", classmethod(counting)):
            model.init_weights(max_seq_len=seq, device=torch.device("cpu"))
        # OLMo-core keeps a window of 16 as (15, 0): 15 keys back
        assert built == ([(seq, 15)] if skip else [(seq, 15), (seq, -1), (seq, -1)])
        with torch.no_grad():
            outputs.append(model(ids))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_the_worker_builds_models_without_the_unused_mask_warmup(tmp_path):
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry
    from olmx.worker import model as worker_model

    reg = registry()
    plan = plan_from_overrides(["infra.nproc_per_node=1", f"trainer.run_dir={tmp_path}"], reg)
    backends = [m for m in worker_model.build_model(plan, reg).modules() if isinstance(m, TorchAttentionBackend)]
    assert backends and all(b.warmup_cache is worker_model._no_warmup for b in backends)
