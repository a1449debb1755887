"""Engram's defaults against the official demo and the paper: placement, the scale at
initialisation, the gate's norm epsilon, and the optimizer groups."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch

from olmx_plugins.layers.engram.config import EngramLayerConfig, default_layer_ids, layer_ids


def _plan(*overrides: str):
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    return plan_from_overrides(list(overrides), reg), reg


def _model(*overrides: str):
    from olmx.worker.model import build_model

    plan, reg = _plan(*overrides)
    torch.manual_seed(0)
    model = build_model(plan, reg)
    model.init_weights(device=torch.device("cpu"))
    return model, plan, reg


@pytest.mark.parametrize(
    ("n_layers", "expected"),
    [(1, [0]), (2, [1]), (3, [1]), (4, [1, 2]), (12, [1, 6]), (16, [1, 8]), (30, [1, 15]), (60, [1, 30])],
)
def test_default_placement_scales_with_depth(n_layers, expected):
    """Block 1 and the middle block: the demo's [1, 15] for its 30 layers, the paper's 12-layer
    ablation pair ("2 and 6", numbered as the demo numbers the paper's "2 and 15"), never the
    last block of a 16-layer model (the old default put it there)."""
    assert default_layer_ids(n_layers) == expected
    assert layer_ids(EngramLayerConfig(), n_layers) == expected
    assert layer_ids(EngramLayerConfig(layer_ids=[3]), n_layers) == [3]
    if n_layers > 1:
        assert max(expected) <= n_layers // 2 < n_layers - 1 or n_layers < 4


def test_default_placement_in_the_plan():
    plan, _ = _plan("layers=[engram]", "model.n_layers=16", "infra.nproc_per_node=1", "parallel=[]")
    assert dict(plan.sections["layers.engram"])["Engram blocks"] == "[1, 8] of 16"


def _rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def _demo_ratio() -> float:
    """RMS(Y) / RMS(h) of the demo at initialisation, by the demo's math: Engram at its
    defaults (d = 1024, n_embed_per_ngram 512, K 8, N 3) with N(0, 1) tables, nn.Linear's
    default projections and nn.RMSNorm() gates (this module equals the demo's Engram with one
    hyper-connection branch), a zero convolution (the paper's init, olmx's default), and the
    demo's residual stream, its N(0, 1) token embeddings."""
    from olmx_plugins.layers.engram.module import Engram

    torch.manual_seed(0)
    engram = Engram(
        d_model=1024,
        table_sizes=[1009 + 2 * j for j in range(16)],
        max_ngram_size=3,
        n_head_per_ngram=8,
        n_embed_per_ngram=512,
        table_init_std=1.0,
    )
    hidden = torch.randn(2, 1024, 1024)
    hash_ids = torch.stack([torch.randint(0, 1009, (2, 1024)) for _ in range(16)], dim=-1)
    with torch.no_grad():
        return _rms(engram(hidden, hash_ids)) / _rms(hidden)


def test_the_demo_ratio():
    """~0.31: the gate's RMS (~0.54, a sigmoid of the signed square root of a ~N(0, 1) score)
    times RMS(W_V e + b) = sqrt(1/3 + 1/(3 d_mem)) ~0.577."""
    z = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    analytic = math.sqrt(torch.sigmoid(z.sign() * z.abs().sqrt()).pow(2).mean().item() * (1 / 3 + 1 / 3072))
    assert analytic == pytest.approx(0.312, abs=0.003)
    assert _demo_ratio() == pytest.approx(analytic, rel=0.03)


def _engram_ratio(*overrides: str) -> tuple[float, float, float]:
    """RMS of Engram's output over RMS of the residual stream entering its block, at OLMo-core's
    initialisation of the engram_tiny model, on real text; that residual's RMS; and the RMS of
    the whole token-embedding table."""
    model, _, _ = _model("experiment=engram_tiny", "infra.nproc_per_node=1", "parallel=[]", *overrides)
    (layer,) = model.engram_inputs.hasher.layer_ids
    block, seen = model.blocks[str(layer)], {}
    block.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    block.engram.register_forward_hook(lambda m, args, out: seen.update(y=out))
    text = inspect.getsource(json.decoder).encode()[: 4 * 256]
    with torch.no_grad():
        model(torch.tensor(list(text)).view(4, 256))
    return _rms(seen["y"]) / _rms(seen["x"]), _rms(seen["x"]), _rms(model.embeddings.weight)


def test_initial_scale_keeps_the_demo_ratio():
    """With the tables drawn like the host's token embeddings (std model.init_std = 0.02, the
    demo draws both from N(0, 1)), Engram adds the demo's fraction of the residual stream where
    that stream is the embeddings (block 0: 0.31 here, 0.31 in the demo); before, with N(0, 1)
    tables, it added ~15x the residual. At block 1 (engram_tiny's) block 0 has already added to
    the residual (RMS 0.0197 -> 0.027), so the fraction is smaller there (0.22)."""
    demo = _demo_ratio()
    ratio, residual, table = _engram_ratio("layers.engram.layer_ids=[0]")
    assert table == pytest.approx(0.0197, rel=0.02)  # N(0, 0.02^2) cut at 3 std: 0.01973, +-0.5% per draw
    # the text's ~80 distinct bytes sample that table: their RMS is within a few % of it
    assert residual == pytest.approx(table, rel=0.06)
    assert ratio == pytest.approx(demo, rel=0.1)
    ratio, residual, _ = _engram_ratio()
    assert 0.15 < ratio < demo and residual == pytest.approx(0.027, rel=0.05)
    old, _, _ = _engram_ratio("layers.engram.layer_ids=[0]", "layers.engram.table_init_std=1.0")
    assert old > 14


def test_table_init_std_scales_the_projection_biases_and_defaults_to_the_model_init_std():
    model, _, _ = _model("experiment=engram_tiny", "infra.nproc_per_node=1", "parallel=[]", "model.init_std=0.01")
    engram = model.blocks["1"].engram
    assert engram.table.init_std == 0.01
    assert engram.table.weight.std().item() == pytest.approx(0.01, rel=0.02)
    bound = 1 / math.sqrt(engram.d_mem)  # nn.Linear's default bias: U(-bound, bound)
    for proj in (engram.key_proj, engram.value_proj):
        assert proj.bias.abs().max().item() <= 0.01 * bound
        assert proj.bias.std().item() == pytest.approx(0.01 * bound / math.sqrt(3), rel=0.15)
        assert proj.weight.abs().max().item() <= bound and proj.weight.abs().max().item() > 0.9 * bound


def test_gate_norms_use_the_float32_epsilon_like_the_demo():
    """The demo's key/query norms are nn.RMSNorm() (eps None: the float32 epsilon, also for
    bfloat16 inputs, which torch normalises in float32); its convolution's norm uses 1e-5."""
    from olmx_plugins.layers.engram.module import Engram

    engram = Engram(d_model=16, table_sizes=[11, 13], max_ngram_size=2, n_head_per_ngram=2, n_embed_per_ngram=8)
    assert engram.key_norm.eps is None and engram.query_norm.eps is None
    assert engram.conv_norm.eps == 1e-5
    h = torch.full((1, 1, 16), 1e-3)
    eps = torch.finfo(torch.float32).eps
    for dtype in (torch.float32, torch.bfloat16):
        out = engram.query_norm.to(dtype)(h.to(dtype)).float()
        assert out.mean().item() == pytest.approx(1e-3 / math.sqrt(1e-6 + eps), rel=1e-2)  # 0.9440
    # The fixed 1e-5 used before gives 0.302 there: 0.644 less (of the unit-RMS output).
    before = torch.nn.RMSNorm(16, eps=1e-5)(h)
    assert (engram.query_norm.float()(h) - before).mean().item() == pytest.approx(0.644, abs=1e-3)


def _groups(*overrides: str) -> dict[str, dict]:
    """Each parameter's optimizer settings (lr, weight_decay) as OLMo-core builds the groups."""
    from olmx.worker.model import build_model
    from olmx.worker.train import train_module_config

    plan, reg = _plan("experiment=engram_tiny", "infra.nproc_per_node=1", "parallel=[]", *overrides)
    model = build_model(plan, reg)
    optim = train_module_config(plan, reg, [n for n, _ in model.named_parameters()]).optim
    out = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optim.build_groups(model):
        opts = {"lr": group.get("lr", optim.lr), "weight_decay": group.get("weight_decay", optim.weight_decay)}
        out.update({names[id(p)]: opts for p in group["params"]})
    assert len(out) == len(names)
    return out


NON_MATRIX = [
    "conv_weight",
    "key_norm.weight",
    "query_norm.weight",
    "conv_norm.weight",
    "key_proj.bias",
    "value_proj.bias",
]


def test_optimizer_groups():
    """Tables: 5x lr, no weight decay (the paper, §4.1). Key/value matrices: the backbone's
    (a Muon backbone's matrices in the paper). Convolution, norm gains, biases (the paper says
    nothing): the backbone's weight decay, as its own norm gains, unless set."""
    lr, wd = 3e-3, 0.1
    groups = _groups()
    engram = "blocks.1.engram."
    assert groups[engram + "table.weight"] == {"lr": 5 * lr, "weight_decay": 0.0}
    for name in ("key_proj.weight", "value_proj.weight", *NON_MATRIX):
        assert groups[engram + name] == {"lr": lr, "weight_decay": wd}, name
    assert groups["blocks.1.attention_norm.weight"] == {"lr": lr, "weight_decay": wd}
    assert groups["embeddings.weight"] == {"lr": lr, "weight_decay": 0.0}

    groups = _groups(
        "layers.engram.non_matrix_weight_decay=0",
        "layers.engram.table_weight_decay=0.01",
        "layers.engram.table_lr_multiplier=2",
    )
    assert groups[engram + "table.weight"] == {"lr": 2 * lr, "weight_decay": 0.01}
    for name in NON_MATRIX:
        assert groups[engram + name] == {"lr": lr, "weight_decay": 0.0}, name
    for name in ("key_proj.weight", "value_proj.weight"):
        assert groups[engram + name] == {"lr": lr, "weight_decay": wd}, name


@pytest.mark.parametrize(
    ("arg", "text"),
    [
        ("layers.engram.table_init_std=0", "must be a positive finite number or null, got 0"),
        ("layers.engram.table_lr_multiplier=-1", "must be a positive finite number, got -1"),
        ("layers.engram.table_weight_decay=-0.1", "must be a finite number >= 0"),
        ("layers.engram.non_matrix_weight_decay=inf", "must be a finite number >= 0"),
    ],
)
def test_optimizer_and_init_settings_are_checked(arg, text):
    from olmx.errors import ConfigError

    with pytest.raises(ConfigError, match=text):
        _plan("experiment=engram_tiny", arg)
