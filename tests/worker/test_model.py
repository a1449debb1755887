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


def test_windows_that_cover_the_sequence_are_left_out_with_the_same_logits():
    """A window of w tokens changes nothing for sequences of at most w tokens: the model built for
    data.seq_len=w has no windowed layer (SDPA runs its causal kernel, no S x S mask) and, with the
    same weights, the logits of the windowed model; one token longer and the windows are kept."""
    import torch
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    model_cfg = ModelConfig(d_model=32, n_layers=3, n_heads=2, sliding_window=[16, -1])
    windowed = build_model_config(model_cfg, vocab_size=384).build(init_device="cpu")
    covered = build_model_config(model_cfg, vocab_size=384, seq_len=16).build(init_device="cpu")
    longer = build_model_config(model_cfg, vocab_size=384, seq_len=17).build(init_device="cpu")

    def windows(model):
        return [m.window_size for m in model.modules() if isinstance(m, TorchAttentionBackend)]

    assert windows(windowed) == windows(longer) == [(15, 0), (-1, -1), (-1, -1)]
    assert windows(covered) == [(-1, -1)] * 3
    torch.manual_seed(0)
    windowed.init_weights(device=torch.device("cpu"))
    covered.load_state_dict(windowed.state_dict())
    ids = torch.randint(0, 384, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(covered(ids), windowed(ids), rtol=0, atol=1e-6)
        # ... and at 17 tokens the window does change the logits (so the test above can fail)
        ids = torch.randint(0, 384, (2, 40))
        assert not torch.allclose(covered(ids), windowed(ids), atol=1e-4)


def test_the_worker_and_export_builds_of_an_olmo3_model(tmp_path):
    """The worker leaves out the windows that cover data.seq_len; export keeps the architecture."""
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry
    from olmx.worker.model import build_model

    reg = registry()
    overrides = ["infra.nproc_per_node=1", f"trainer.run_dir={tmp_path}", "model.sliding_window=[64,64,-1]"]
    overrides += ["model.block=reordered_norm", "model.qk_norm=true", "data.seq_len=64"]
    plan = plan_from_overrides(overrides, reg)
    assert any("cover data.seq_len=64" in row for row in plan.execution.notes)

    def windows(model):
        return {m.window_size for m in model.modules() if isinstance(m, TorchAttentionBackend)}

    assert windows(build_model(plan, reg)) == {(-1, -1)}
    assert windows(build_model(plan, reg, keep_windows=True)) == {(63, 0), (-1, -1)}


def test_auto_attention_takes_only_kernels_that_import_and_flash_3_only_on_hopper(monkeypatch):
    from olmo_core.nn.attention import flash_attn_api

    from olmx.worker.model import attention_backend

    def choose(cc, dtype="bfloat16"):
        return attention_backend("auto", device="cuda", compute_dtype=dtype, compute_capability=cc)

    # flash-attn that does not import (absent, or built for another torch) is never chosen
    monkeypatch.setattr(flash_attn_api, "flash_attn_2", None)
    monkeypatch.setattr(flash_attn_api, "flash_attn_3", None)
    assert choose((9, 0)) == "torch"
    monkeypatch.setattr(flash_attn_api, "flash_attn_2", object())
    assert choose((9, 0)) == choose((10, 0)) == choose((8, 0)) == "flash_2"
    monkeypatch.setattr(flash_attn_api, "flash_attn_3", object())
    assert choose((9, 0)) == "flash_3"
    assert choose((10, 0)) == "flash_2"  # OLMo-core runs flash-attention 3 only on SM 9.x
    assert choose((9, 0), "float32") == "torch"
    assert attention_backend("auto", device="cpu", compute_dtype="bfloat16") == "torch"
    assert attention_backend("flash_2", device="cuda") == "flash_2"  # an explicit choice stands


def test_the_plan_warns_when_no_flash_kernel_is_installed(tmp_path, monkeypatch):
    import importlib.util

    from olmx.plan import execution
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    overrides = ["infra=slurm", "infra.gpus_per_node=1", "infra.gpu_name=NVIDIA H200", f"trainer.run_dir={tmp_path}"]
    real = importlib.util.find_spec
    for installed, warned in ((False, True), (True, False)):
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, _i=installed: (
                (object() if _i else None) if name in execution.FLASH_MODULES else real(name, *a)
            ),
        )
        plan = plan_from_overrides(overrides, registry())
        rows = dict(plan.sections.get("warnings", []))
        assert ("no flash-attention package" in rows.get("attention", "")) is warned
    cpu = plan_from_overrides(["infra.nproc_per_node=1", f"trainer.run_dir={tmp_path}"], registry())
    assert "attention" not in dict(cpu.sections.get("warnings", []))


def test_trainer_seed_seeds_the_initial_weights(tmp_path):
    """trainer.seed is the seed of initialisation (OLMo-core's init_seed was left at 0, so every
    seed started from the same weights)."""
    import torch

    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry
    from olmx.worker.model import build_model

    reg = registry()

    def initial(seed: int) -> dict:
        plan = plan_from_overrides(
            ["infra.nproc_per_node=1", f"trainer.run_dir={tmp_path}", f"trainer.seed={seed}"], reg
        )
        model = build_model(plan, reg)
        model.to_empty(device="cpu")
        model.init_weights(device=torch.device("cpu"))
        return model.state_dict()

    a, b, c = initial(1), initial(1), initial(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attention.w_q.weight"], c["blocks.0.attention.w_q.weight"])
