"""The example third-party precision plugin ``examples/olmx-halfcast``, which nothing in olmx
knows about: installed with pip (offline, into a temporary directory), its own tests run
against the installed copy, and composed with Engram, MoE, the data-parallel strategies and
Ulysses through capabilities alone, in plans and in a real 2-process training run compared
with fp32."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, olmx_cli
from tests.plugin_tools.test_plugin_tools import pip_install, site_env
from tests.test_training import SMALL, losses, train

EXAMPLE = REPO / "examples" / "olmx-halfcast"
MOE_ENGRAM = ["layers=[engram,moe]", "layers.moe.num_experts=4", "layers.engram.layer_ids=[1]"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Environment of subprocesses that see the installed example (and a shared data cache)."""
    root = tmp_path_factory.mktemp("halfcast")
    source = root / "olmx-halfcast"  # build from a copy: pip writes build/ and *.egg-info in the tree
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*cache"))
    pip_install(source, target=root / "site")
    return {**site_env(root / "site"), "OLMX_CACHE_DIR": str(root / "cache")}


def test_its_own_tests_pass_against_the_installed_copy(env, tmp_path):
    shutil.copytree(EXAMPLE / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout, proc.stdout


def plan_of(env, tmp_path, *overrides: str) -> dict:
    """The plan ``olmx train --dry-run`` prints for the overrides (rows by label)."""
    proc = olmx_cli(
        "train",
        *SMALL,
        "precision=halfcast",
        f"trainer.run_dir={tmp_path}",
        *overrides,
        "--dry-run",
        env={**env, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_it_composes_with_layers_and_strategies_through_capabilities(env, tmp_path):
    fsdp = plan_of(env, tmp_path, "parallel=[fsdp]", *MOE_ENGRAM)
    assert "compute bfloat16, gradient reduction bfloat16" in fsdp  # parameters sharded: reduce in half
    assert "half of float32's (bfloat16 reduce-scatter)" in fsdp
    assert "layers.moe" in fsdp and "layers.engram" in fsdp
    hsdp_ep = plan_of(
        env,
        tmp_path,
        "parallel=[hsdp]",
        "parallel.hsdp.expert_parallel=true",
        "layers=[moe]",
        "layers.moe.num_experts=4",
    )
    assert "ep=2" in hsdp_ep and "compute bfloat16, gradient reduction bfloat16" in hsdp_ep
    ddp_uly = plan_of(
        env,
        tmp_path,
        "infra.nproc_per_node=4",
        "parallel=[ddp,ulysses]",
        "layers=[engram]",
        "layers.engram.layer_ids=[1]",
    )
    assert "compute bfloat16, gradient reduction float32" in ddp_uly  # replicated: the reduction stays float32
    assert "2-byte activations" in ddp_uly  # Ulysses reads the dtypes it chose
    refused = olmx_cli(
        "train",
        *SMALL,
        "precision=halfcast",
        "precision.require_sharding=true",
        "parallel=[ddp_ep]",
        "layers=[moe]",
        f"trainer.run_dir={tmp_path / 'no'}",
        "--dry-run",
        env=env,
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: precision.require_sharding: the 2 data-parallel ranks")
    assert not (tmp_path / "no").exists()


@pytest.mark.dist
def test_a_moe_engram_fsdp_run_in_halfcast_tracks_fp32(env, tmp_path):
    steps = ["trainer.max_steps=4", "trainer.save_interval=100", "parallel=[fsdp]", *MOE_ENGRAM]
    ref = losses(train(tmp_path / "fp32", env, *steps))
    half = losses(train(tmp_path / "half", env, *steps, "precision=halfcast"))
    plan = yaml.safe_load((tmp_path / "half" / "plan.yaml").read_text())
    assert plan["dtypes"] == {"param": "bfloat16", "reduce": "bfloat16"} and plan["mesh"]["shards_params"]
    assert half != ref  # bfloat16 compute changes the numbers ...
    assert half == pytest.approx(ref, rel=0.03)  # ... by little
    assert half[-1] < half[0]
