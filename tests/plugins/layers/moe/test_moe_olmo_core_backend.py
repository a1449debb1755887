"""``layers.moe.backend``: the portable MoE mapped onto OLMo-core's v1 MoE, and the choice.

On CPU: the config mapping, both models' construction and parameter counts, the two-way
state-dict mapping, the backend choice and the plan's refusals. On a CUDA GPU (``gpu``
marker): both paths with the same weights and batch give the same loss and gradients.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from moe_testing import tiny_moe_model_config
from olmo_core.nn.transformer import TransformerBlockType, TransformerType
from typer.testing import CliRunner

from olmx.api import Mesh, World
from olmx.cli import app
from olmx.errors import ConfigError
from olmx_plugins.layers.moe.config import MoEDecisions
from olmx_plugins.layers.moe.convert import convert_model_state_dict
from olmx_plugins.layers.moe.plugin import MOE, MoEConfig, choose_backend

CPU, GPU = World(1, 2), World(1, 2, device="cuda", device_name="NVIDIA H100")
MAP = dict(num_experts=4, d_model=64, hidden_size=32, dropless=True)  # tiny_moe_model_config's MoE


def _both(**moe_kw):
    """The tiny portable model config and its OLMo-core v1 equivalent."""
    portable = tiny_moe_model_config(shared_expert_mixing="olmo_core_v1", **moe_kw)
    blocks = {**portable.block, "moe": portable.block["moe"].to_olmo_core_v1()}
    return portable, dataclasses.replace(portable, name=TransformerType.moe, block=blocks)


@pytest.mark.parametrize("reordered", [False, True])
def test_config_maps_onto_olmo_core_v1_with_equal_parameter_counts(reordered):
    portable, v1 = _both(bias_gamma=0.01, normalize_expert_weights=1.0, gating="sigmoid")
    if reordered:
        portable.block["moe"].name = TransformerBlockType.reordered_norm
        v1 = dataclasses.replace(v1, block={**v1.block, "moe": portable.block["moe"].to_olmo_core_v1()})
    block = v1.block["moe"]
    assert block.name == (TransformerBlockType.moe_reordered_norm if reordered else TransformerBlockType.moe)
    assert block.feed_forward is None and block.feed_forward_moe.name == "dropless"
    router = block.feed_forward_moe.router
    assert (router.top_k, router.bias_gamma, router.normalize_expert_weights, router.gating_function) == (
        2,
        0.01,
        1.0,
        "sigmoid",
    )
    assert block.feed_forward_moe.shared_mlp.hidden_size == 32 and block.feed_forward_moe.z_loss_weight == 0.001
    assert v1.num_params == portable.num_params and v1.num_active_params == portable.num_active_params
    a, b = portable.build(init_device="meta"), v1.build(init_device="meta")
    assert type(b).__name__ == "MoETransformer"
    assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in b.parameters()) == v1.num_params
    capacity = tiny_moe_model_config(capacity_factor=1.5, shared_hidden_size=None).block["moe"].to_olmo_core_v1()
    assert capacity.feed_forward_moe.name == "default" and capacity.feed_forward_moe.capacity_factor == 1.5


def test_shared_expert_needs_the_v1_mixing():
    from olmo_core.exceptions import OLMoConfigurationError

    with pytest.raises(OLMoConfigurationError, match="shared_expert_mixing"):
        tiny_moe_model_config().block["moe"].to_olmo_core_v1()  # olmx's default mixing: sum
    # What a user reaches: layers.moe with a shared expert on the olmo_core backend, at plan time.
    with pytest.raises(ConfigError, match="olmo_core cannot run here: OLMo-core's v1 MoE mixes a shared expert"):
        choose_backend(MoEConfig(backend="olmo_core", shared_hidden_size=16), DDP, GPU)


@pytest.mark.parametrize("dropless", [True, False])
def test_state_dict_maps_both_ways_exactly(dropless):
    portable, v1 = _both(bias_gamma=0.01, capacity_factor=None if dropless else 1.5)
    a = portable.build(init_device="cpu")
    a.init_weights(device=torch.device("cpu"))
    b = v1.build(init_device="cpu")
    sd = a.state_dict()
    with torch.no_grad():
        a.blocks["1"].moe.router.score_bias.normal_()
    to_v1 = convert_model_state_dict(a.state_dict(), to="olmo_core_v1", **{**MAP, "dropless": dropless})
    assert any(k.startswith("blocks.1.feed_forward_moe.experts.mlp.") for k in to_v1)
    b.load_state_dict(to_v1, strict=True)  # every key and shape matches the v1 model
    back = convert_model_state_dict(b.state_dict(), to="portable", **{**MAP, "dropless": dropless})
    assert back.keys() == sd.keys()
    for key, value in a.state_dict().items():
        assert torch.equal(back[key], value), key
    # the v1 MoE's router and expert MLPs run on CPU on their own: same expert outputs
    x, counts = torch.randn(8, 64), torch.tensor([2, 2, 2, 2])
    v1_experts = b.blocks["1"].feed_forward_moe.experts.mlp
    expected = v1_experts(x, counts) if dropless else v1_experts(x.view(4, 2, 64)).reshape(8, 64)
    torch.testing.assert_close(a.blocks["1"].moe.experts(x, counts), expected)


DDP = Mesh(dp_replicate=2)
HSDP_EP = Mesh(dp_replicate=1, dp_shard=2, ep=2, shards_params=True, hybrid=True)
DDP_EP = Mesh(dp_replicate=2, ep=2)


def test_backend_choice():
    cfg = MoEConfig()
    assert choose_backend(cfg, DDP, CPU)[0] == "portable"
    assert choose_backend(cfg, HSDP_EP, GPU) == (
        "portable",
        "auto: OLMo-core's MoE could run here but is opt-in "
        "(layers.moe.backend=olmo_core) until olmx has "
        "checked it on a GPU",
    )
    backend, why = choose_backend(cfg, DDP_EP, GPU)
    assert backend == "portable" and "v2 stack (OLMoDDPModelConfig)" in why
    assert choose_backend(MoEConfig(shared_hidden_size=16), DDP, GPU)[0] == "portable"
    assert choose_backend(MoEConfig(backend="portable"), DDP, GPU)[0] == "portable"
    with pytest.raises(ConfigError, match="or the portable backend"):
        choose_backend(MoEConfig(backend="olmo_core"), DDP_EP, GPU)


def _plan(world: World, mesh: Mesh, backend: str, **moe) -> SimpleNamespace:
    """What the moe plugin's build hooks read of a plan: the run, world, mesh and its decision."""
    run = SimpleNamespace(model=SimpleNamespace(hidden_size=32, init_std=0.02), trainer=SimpleNamespace(seed=0))
    return SimpleNamespace(world=world, mesh=mesh, run=run, decisions={"layers.moe": MoEDecisions(backend=backend)})


def test_olmo_core_backend_builds_the_v1_model_and_olmo_core_ep():
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerExpertParallelConfig, TransformerTrainModuleConfig

    TRAIN_MODULE = {"rank_microbatch_size": 64, "max_sequence_length": 16, "optim": AdamWConfig()}

    base = TransformerConfig.llama_like(d_model=64, vocab_size=384, n_layers=2, n_heads=4)
    cfg = MoEConfig(num_experts=4, every=2, backend="olmo_core")
    plan = _plan(GPU, HSDP_EP, "olmo_core")
    model_config = MOE.apply_model_config(cfg, base, plan)
    assert model_config.name == TransformerType.moe and model_config.block_pattern == ["dense", "moe"]
    assert model_config.block["moe"].feed_forward_moe.num_experts == 4
    config = MOE.apply_train_module(cfg, TransformerTrainModuleConfig(**TRAIN_MODULE), plan, ())
    assert config.ep_config == TransformerExpertParallelConfig(degree=2)
    portable = _plan(CPU, HSDP_EP, "portable")
    assert type(MOE.apply_model_config(cfg, base, portable).block["moe"]).__name__ == "MoEBlockConfig"
    config = MOE.apply_train_module(cfg, TransformerTrainModuleConfig(**TRAIN_MODULE), portable, ())
    assert config.ep_config is None


@pytest.mark.parametrize("capacity_factor", [None, 1.5])
def test_one_seed_builds_one_initial_model_whichever_the_backend(capacity_factor):
    """The plugin's hooks on both backends, then OLMo-core's ``init_weights`` (what its train
    module calls after parallelism): the v1 model, converted, equals the portable one exactly,
    every key (the MoE layers are drawn as the portable ones and take nothing from the model's
    generator, so the attention, dense and head weights after them agree too)."""
    from olmo_core.nn.transformer import TransformerConfig

    base = TransformerConfig.llama_like(d_model=32, vocab_size=256, n_layers=4, n_heads=4, attn_backend="torch")
    cfg = MoEConfig(num_experts=4, every=2, capacity_factor=capacity_factor)
    states = {}
    for backend in ("portable", "olmo_core"):
        plan = _plan(GPU, Mesh(), backend)
        plan.run.trainer.seed, plan.run.model.init_std = 7, 0.03
        model = MOE.apply_model_config(cfg, base, plan).build(init_device="meta")
        MOE.apply_model(cfg, model, plan)
        model.init_weights(device=torch.device("cpu"))
        states[backend] = model.state_dict()
    v1 = convert_model_state_dict(
        states["olmo_core"], to="portable", num_experts=4, d_model=32, hidden_size=32, dropless=capacity_factor is None
    )
    assert v1.keys() == states["portable"].keys()
    for key, value in states["portable"].items():
        assert torch.equal(v1[key], value), key
    assert states["portable"]["blocks.1.moe.experts.w1"].std().item() == pytest.approx(0.03, rel=0.2)


def test_plan_warns_when_olmo_core_would_loop_over_experts_in_python(monkeypatch):
    """Without ``grouped_gemm`` OLMo-core's dropless MoE loops over its experts in Python: the
    plan says so on CUDA, with the cost and the fix; not with it installed, not for the capacity
    MoE (batched matmuls), not on the portable backend."""
    from olmx.api import Context, Dtypes

    find_spec = importlib.util.find_spec
    installed: set[str] = set()
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in installed else find_spec(name, *a)
    )
    monkeypatch.setitem(sys.modules, "grouped_gemm", None)  # find_spec("grouped_gemm") is None

    def warnings(world: World, **moe) -> list[str]:
        run = SimpleNamespace(
            model=SimpleNamespace(n_layers=2, d_model=64, hidden_size=128, init_std=0.02),
            trainer=SimpleNamespace(activation_checkpointing=None),
        )
        ctx = Context(run=run, world=world, mesh=HSDP_EP, dtypes=Dtypes(), vocab_size=384)  # type: ignore[arg-type]
        return [v for k, v in MOE.resolve(MoEConfig(num_experts=4, **moe), ctx).rows if k == "warning"]

    (warning,) = warnings(GPU, backend="olmo_core")
    assert warning.startswith("the grouped_gemm package is not installed")
    assert "3 x 4 small matmuls per MoE block and micro-batch" in warning
    assert "pip install grouped_gemm" in warning and "layers.moe.backend=portable" in warning
    assert warnings(GPU, backend="olmo_core", capacity_factor=1.5) == []
    assert warnings(GPU, backend="portable") == []
    assert warnings(GPU) == []  # auto: portable for now
    installed.add("grouped_gemm")
    assert warnings(GPU, backend="olmo_core") == []


def test_plan_shows_the_backend_and_refuses_olmo_core_on_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["train", "--dry-run", "layers=[moe]"])
    assert out.exit_code == 0 and "portable (auto: OLMo-core's MoE needs CUDA" in out.stdout
    result = CliRunner().invoke(app, ["train", "--dry-run", "layers=[moe]", "layers.moe.backend=olmo_core"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(
        "error: layers.moe.backend: olmo_core cannot run here: OLMo-core's MoE "
        "needs CUDA (its token permutation is Triton kernels) and this run's "
        "device is cpu (cpu); TRITON_INTERPRET=1 runs them on CPU through Triton's interpreter (slow; "
        "for numerics); use layers.moe.backend=portable or auto"
    )


def parity(device: str) -> None:
    """The portable MoE and OLMo-core's v1 MoE (its Triton kernels) with the same weights and
    batch give the same loss and gradients."""
    dev = torch.device(device)
    portable, v1 = _both(bias_gamma=0.01)
    a = portable.build(init_device=device)
    a.init_weights(device=dev)
    b = v1.build(init_device=device)
    b.load_state_dict(convert_model_state_dict(a.state_dict(), to="olmo_core_v1", **MAP))
    ids = torch.randint(0, 384, (4, 32), generator=torch.Generator().manual_seed(0)).to(dev)
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = -100
    losses = []
    for model in (a, b):
        out = model(ids, labels=labels, loss_reduction="sum", loss_div_factor=(labels != -100).sum())
        out.loss.backward()
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    grads = convert_model_state_dict({n: p.grad for n, p in b.named_parameters()}, to="portable", **MAP)
    for name, p in a.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)
    print("parity ok", losses[0].item())


#: Run before OLMo-core's kernels are imported, in a process of its own: Triton's interpreter
#: (TRITON_INTERPRET=1) runs the kernels on CPU; its autotuner, which benchmarks on a GPU,
#: keeps the first config.
INTERPRETED = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import triton
_autotune = triton.autotune
triton.autotune = lambda configs, *a, **k: _autotune(configs[:1], *a, **k)
sys.path[:0] = [{here!r}, {repo!r}]
from test_moe_olmo_core_backend import parity
parity("cpu")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_both_paths_give_the_same_loss_and_gradients_on_gpu():
    parity("cuda")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install triton)")
def test_both_paths_give_the_same_loss_and_gradients_under_tritons_interpreter():
    """OLMo-core's MoE kernels on CPU through Triton's interpreter: the same numbers."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = INTERPRETED.format(here=str(here), repo=str(here.parents[3]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parity ok" in proc.stdout
