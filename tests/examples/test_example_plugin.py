"""The example third-party plugin ``examples/olmx-layerscale``, end to end: installed with pip
(offline, into a temporary directory), listed, checked, its own tests run against the
installed copy, and used in real 2-process training runs compared with runs without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, olmx_cli
from tests.plugin_tools.test_plugin_tools import pip_install, site_env
from tests.test_training import SMALL, losses, train

EXAMPLE = REPO / "examples" / "olmx-layerscale"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Environment of subprocesses that see the installed example (and a shared data cache)."""
    root = tmp_path_factory.mktemp("layerscale")
    source = root / "olmx-layerscale"  # build from a copy: pip writes build/ and *.egg-info in the tree
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*cache"))
    pip_install(source, target=root / "site")
    return {**site_env(root / "site"), "OLMX_CACHE_DIR": str(root / "cache")}


def test_it_is_listed_and_passes_plugins_check(env):
    proc = olmx_cli("plugins", "list", "--kind", "layer", "--json", "--check", env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in json.loads(proc.stdout) if r["name"] == "layerscale")
    assert (row["distribution"], row["status"], row["target"]) == (
        "olmx-layerscale",
        "ok",
        "olmx_layerscale.plugin:LAYERSCALE",
    )
    assert row["description"].startswith("LayerScale: learnable per-channel scales")
    for target in ("olmx-layerscale", str(EXAMPLE)):  # the installed distribution, the source tree
        proc = olmx_cli("plugins", "check", target, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "all checks passed" in proc.stdout


def test_its_own_tests_pass_against_the_installed_copy(env, tmp_path):
    # A copy of its tests, away from its source tree, so they import the installed package.
    shutil.copytree(EXAMPLE / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    conftest = "import olmx_layerscale\nprint('testing', olmx_layerscale.__file__)\n"
    (tmp_path / "tests" / "conftest.py").write_text(conftest)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-rs", "tests"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "15 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    assert f"testing {env['PYTHONPATH'].split(os.pathsep)[0]}/olmx_layerscale/__init__.py" in proc.stdout


def test_dry_run_plans_its_parameters_and_uses_its_presets(env, tmp_path):
    proc = olmx_cli("train", *SMALL, "layers=[layerscale_deep]", f"trainer.run_dir={tmp_path}", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "layers.layerscale" in out
    assert "init: 1.0e-06" in out  # the package's conf/layers/layerscale_deep.yaml
    assert "256 = 2 blocks x 2 branches x d_model 64" in out
    proc = olmx_cli(
        "train",
        *SMALL,
        "layers=[layerscale]",
        "layers.layerscale.blocks=[5]",
        f"trainer.run_dir={tmp_path}",
        "--dry-run",
        env=env,
    )
    assert proc.returncode == 2
    assert "layers.layerscale.blocks: [5] outside [0, model.n_layers=2)" in proc.stderr


def checkpoint(run_dir, part: str) -> dict:
    """The entries of the run's last OLMo-core checkpoint whose key contains ``part``."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

    step = max((run_dir / "checkpoints").glob("step*"), key=lambda p: int(p.name[4:])) / "model_and_optim"
    keys = [k for k in get_checkpoint_metadata(step).state_dict_metadata if part in k]
    return dict(zip(keys, load_keys(step, keys), strict=True))


@pytest.mark.dist
def test_training_with_it_changes_the_model_and_trains_its_scales(env, tmp_path):
    import torch

    steps = ["trainer.max_steps=6", "trainer.save_interval=100"]
    base = train(tmp_path / "base", env, *steps)
    # Scales of 1 leave the initial model unchanged (same seed): the first losses are identical
    # and every later difference comes from the scales (runs are bitwise reproducible).
    scaled = train(tmp_path / "scaled", env, *steps, "layers=[layerscale]", "layers.layerscale.init=1.0")
    assert losses(scaled)[0] == losses(base)[0]
    later = zip(losses(scaled)[1:], losses(base)[1:], strict=True)
    assert all(a != b for a, b in later), (losses(scaled), losses(base))
    assert losses(scaled)[-1] < losses(scaled)[0] - 0.3  # it learns
    assert "layerscale:" in (tmp_path / "scaled" / "plan.yaml").read_text()

    saved = checkpoint(tmp_path / "scaled", ".scale")
    names = [f"blocks.{i}.{b}_residual_stream.scale" for i in (0, 1) for b in ("attention", "feed_forward")]
    assert sorted(k for k in saved if k.startswith("model.")) == [f"model.{n}" for n in names]
    for name in names:
        scale = saved[f"model.{name}"]
        assert scale.shape == (64,)
        assert not torch.equal(scale, torch.ones(64))  # trained away from their initial value
        assert (scale - 1).abs().max() < 0.1
        assert saved[f"optim.state.{name}.exp_avg_sq"].shape == (64,)  # with AdamW state, for resuming
        assert saved[f"optim.param_groups.{name}.weight_decay"] == 0.0  # their own optimizer group
    assert checkpoint(tmp_path / "scaled", "w_q.weight.weight_decay") == {
        "optim.param_groups.blocks.0.attention.w_q.weight.weight_decay": 0.1,
        "optim.param_groups.blocks.1.attention.w_q.weight.weight_decay": 0.1,
    }
    assert checkpoint(tmp_path / "base", ".scale") == {}


@pytest.mark.dist
def test_it_composes_with_moe_under_fsdp(env, tmp_path):
    """A plugin author's trial: the residual-scaling layer beside the MoE layer, listed first
    (the layers' ``order`` applies MoE's blocks first), under FSDP on 2 processes. MoE's blocks
    are built from OLMo-core's residual streams, so the scales land in them and train."""
    import torch

    run = tmp_path / "moe"
    steps = ["trainer.max_steps=4", "trainer.save_interval=100", "parallel=[fsdp]", "trainer.micro_batch_size=2"]
    moe = ["layers.moe.num_experts=4", "layers.moe.top_k=2", "layers.moe.hidden_size=128"]
    recs = train(run, env, *steps, "layers=[layerscale,moe]", *moe)
    assert losses(recs)[-1] < losses(recs)[0]
    saved = checkpoint(run, ".scale")
    names = [f"model.blocks.{i}.{b}_residual_stream.scale" for i in (0, 1) for b in ("attention", "feed_forward")]
    assert sorted(k for k in saved if k.startswith("model.")) == names
    assert all(not torch.equal(saved[n], torch.full((64,), 0.1)) for n in names)  # trained from init 0.1
