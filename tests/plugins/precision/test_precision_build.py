"""The build side of ``bf16`` and ``mxfp8``: OLMo-core fields, and the MXFP8 conversion of
built OLMo-core models on both paths (emulated torchao, and OLMo-core's SM100 Float8Config)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from olmx.config.schema import ModelConfig
from olmx.plan.linears import dense_linears
from olmx_plugins.precision.mxfp8 import MXFP8Config, keep_reason

VOCAB = 384


def build(model: ModelConfig) -> nn.Module:
    from olmx.worker.model import build_model_config

    return build_model_config(model, vocab_size=VOCAB).build(init_device="meta")


def linears(module: nn.Module) -> list[tuple[str, int, int]]:
    return [(n, m.in_features, m.out_features) for n, m in module.named_modules() if isinstance(m, nn.Linear)]


def test_torch_free_layer_list_is_the_built_models():
    for cfg in (
        ModelConfig(d_model=64, n_layers=2, n_heads=4, hidden_size=96),
        ModelConfig(d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, hidden_size=256),
    ):
        planned = [(layer.name, layer.in_features, layer.out_features) for layer in dense_linears(cfg, VOCAB)]
        assert sorted(planned) == sorted(linears(build(cfg)))


@pytest.mark.parametrize(
    "layers",
    [
        ["layers=[moe]", "layers.moe.every=2", "layers.moe.shared_hidden_size=64"],
        ["layers=[engram]"],
    ],
)
def test_the_plans_mxfp8_layer_list_is_what_the_worker_converts_in_models_with_layer_plugins(layers):
    """Layer plugins edit the torch-free list (``linear_layers``): MoE blocks lose the dense
    feed-forward and bring shared experts, Engram brings its projections (kept)."""
    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import build_context, resolve
    from olmx.registry import registry
    from olmx.worker.model import build_model
    from olmx_plugins.precision.mx import apply_mxfp8

    reg = registry()
    common = ["infra.nproc_per_node=1", "parallel=[]", *layers]
    run = to_object(compose([*common, "precision=mxfp8", "precision.emulate=true"], reg), reg)
    plan = resolve(run, reg)
    dense_run = to_object(compose(common, reg), reg)  # the same model, before any conversion
    model = build_model(resolve(dense_run, reg), reg)
    planned = build_context(run, plan.world, reg).linear_layers()
    built = [
        (n, m.in_features, m.out_features, type(m) is not nn.Linear)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    assert sorted((x.name, x.in_features, x.out_features, x.subclass) for x in planned) == sorted(built)
    convert = plan.decisions["precision"].convert
    assert dict(plan.sections["precision"])["MXFP8 linear layers"].startswith(f"{len(convert)}: ")
    assert not [name for name in convert if "engram" in name or name.startswith("lm_head")]  # marked keep
    # the worker converts exactly the plan's list in the built model
    assert apply_mxfp8(model, run.precision["mxfp8"], convert=convert, emulate=True) == sorted(convert)


def planned_names(cfg: ModelConfig) -> list[str]:
    """The layers the plan's rule converts in the dense model ``cfg``."""
    return [
        layer.name
        for layer in dense_linears(cfg, VOCAB)
        if keep_reason(layer.name, layer.in_features, layer.out_features, keep=layer.keep) is None
    ]


def test_emulated_conversion_follows_the_plan_rule_and_keeps_parameter_names():
    from torchao.prototype.mx_formats.mx_linear import MXLinear

    from olmx_plugins.precision.mx import apply_mxfp8

    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, hidden_size=128)
    model = build(cfg)
    names = [n for n, _ in model.named_parameters()]
    planned = planned_names(cfg)
    done = apply_mxfp8(model, MXFP8Config(), convert=planned, emulate=True)
    assert done == sorted(planned) and len(done) == 10  # q, o, w1, w2, w3 per block; k/v are 64 -> 16
    assert not isinstance(model.get_submodule("blocks.0.attention.w_k"), MXLinear)
    assert not isinstance(model.get_submodule("lm_head.w_out"), MXLinear)
    assert [n for n, _ in model.named_parameters()] == names  # checkpoints stay interchangeable
    w1 = model.get_submodule("blocks.1.feed_forward.w1")
    assert w1.config.kernel_preference.value == "emulated" and w1.config.scale_calculation_mode.value == "rceil"
    assert w1.config.block_size == 32 and w1.config.elem_dtype == torch.float8_e4m3fn


def test_sm100_path_goes_through_olmo_core_float8_config_with_the_same_layers(monkeypatch):
    """OLMo-core refuses ``ao_mx`` below SM100; with its capability check answered yes, its own
    ``Transformer.apply_fp8`` accepts olmx's ``modules_to_ignore`` and converts the same layers,
    with the real-kernel settings."""
    import olmo_core.float8

    from olmx_plugins.precision.mx import apply_mxfp8

    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, hidden_size=80)
    emulated = apply_mxfp8(build(cfg), MXFP8Config(), convert=planned_names(cfg), emulate=True)
    monkeypatch.setattr(olmo_core.float8, "has_compute_capability", lambda major, minor: (major, minor) <= (10, 0))
    model = build(cfg)
    assert apply_mxfp8(model, MXFP8Config(scale_calculation_mode="floor"), convert=emulated, emulate=False) == emulated
    assert emulated == [f"blocks.{i}.attention.{w}" for i in range(2) for w in ("w_k", "w_out", "w_q", "w_v")]
    q = model.get_submodule("blocks.0.attention.w_q").config
    assert (q.kernel_preference.value, q.mxfp8_cast_kernel_choice.value, q.scale_calculation_mode.value) == (
        "auto",
        "triton",  # torchao 0.15's "cuda" cast has no kernel under torch 2.13 (its C++ extensions do not load)
        "floor",
    )
    assert model.fp8_enabled


def test_marked_layers_subclasses_excluded_and_odd_dims_stay_in_high_precision():
    from olmx.api import LinearLayer
    from olmx.plan.linears import HEAD_KEEP
    from olmx_plugins.layers.engram.plugin import PROJECTION_KEEP

    layers = [
        LinearLayer("blocks.0.proj", 64, 64),
        LinearLayer("blocks.0.moe.shared_expert.w1", 64, 64, subclass=True),
        LinearLayer("blocks.0.engram.key_proj", 64, 64, keep=PROJECTION_KEEP),
        LinearLayer("blocks.0.odd", 64, 40),
        LinearLayer("blocks.0.mine", 64, 64),
        LinearLayer("lm_head.w_out", 64, 384, keep=HEAD_KEEP),
    ]
    why = {
        x.name: keep_reason(x.name, x.in_features, x.out_features, keep=x.keep, subclass=x.subclass, exclude=["*.mine"])
        for x in layers
    }
    assert why["blocks.0.proj"] is None
    assert why["blocks.0.moe.shared_expert.w1"].startswith("nn.Linear subclass")
    assert why["blocks.0.engram.key_proj"] == PROJECTION_KEEP  # the owner's reason, not a name pattern
    assert why["blocks.0.odd"] == "out_features=40 not a multiple of the MX block size 32"
    assert why["blocks.0.mine"] == "precision.exclude matches '*.mine'"
    assert why["lm_head.w_out"] == HEAD_KEEP
    # a name alone keeps nothing: an unmarked layer called "router" or "engram" is converted
    assert keep_reason("blocks.0.router", 64, 64) is None and keep_reason("engram.x", 64, 64) is None


def test_the_core_applies_the_plans_dtypes_as_fsdp_mixed_precision_or_autocast(tmp_path):
    """bf16 and mxfp8 only choose dtypes; the core sets OLMo-core's fields by the mesh."""
    from olmo_core.config import DType

    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import resolve
    from olmx.registry import registry
    from olmx.worker.train import train_module_config

    reg = registry()

    def config_for(*overrides: str):
        run = to_object(compose(["infra.nproc_per_node=2", f"trainer.run_dir={tmp_path}", *overrides], reg), reg)
        return train_module_config(resolve(run, reg), reg)

    k = config_for("parallel=[fsdp]", "precision=bf16", "precision.reduce_dtype=bfloat16")
    assert (k.dp_config.param_dtype, k.dp_config.reduce_dtype) == (DType.bfloat16, DType.bfloat16)
    assert k.autocast_precision is None
    k = config_for("parallel=[ddp]", "precision=bf16")
    assert k.autocast_precision == DType.bfloat16 and k.dp_config.param_dtype is None
    k = config_for("parallel=[ddp]", "precision=mxfp8", "precision.emulate=true")
    assert k.autocast_precision is None  # CPU without sharding: the rest stays float32
    k = config_for("parallel=[fsdp]", "precision=mxfp8", "precision.emulate=true")
    assert k.dp_config.param_dtype == DType.bfloat16


@pytest.mark.parametrize("layers", [[], ["layers=[moe]", "layers.moe.shared_hidden_size=64"], ["layers=[engram]"]])
def test_fp8_converts_exactly_the_layers_the_plan_lists(layers):
    """The worker's conversion (``apply_model``) takes the plan's list and checks the result."""
    from torchao.float8.float8_linear import Float8Linear

    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import resolve
    from olmx.registry import registry
    from olmx.worker.model import build_model

    reg = registry()
    run = to_object(
        compose(["infra.nproc_per_node=1", "parallel=[]", *layers, "precision=fp8", "precision.emulate=true"], reg),
        reg,
    )
    plan = resolve(run, reg)
    planned = plan.decisions["precision"].convert
    model = build_model(plan, reg)
    assert sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear)) == planned
    assert "lm_head.w_out" not in planned and not [n for n in planned if "engram" in n or "shared_expert" in n]
    rows = dict(plan.sections["precision"])
    assert rows["FP8 linear layers"].startswith(f"{len(planned)}: ")
