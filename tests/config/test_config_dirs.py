"""The user's own config directories: ``olmx train --config-dir DIR`` and ``OLMX_CONFIG_PATH``
add their groups' options (``experiment/NAME.yaml``, ``model/NAME.yaml``) to the config tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError
from olmx.registry import registry
from tests.conftest import olmx_cli

RECIPE = """\
# @package _global_
# A recipe of the user's own, outside the repository.
defaults:
  - override /model: narrow
trainer:
  max_steps: 7
"""
MODEL = """\
defaults:
  - tiny
d_model: 48
"""


def recipes(root: Path) -> Path:
    """A config directory with an experiment and a model of its own (the model extends olmx's tiny)."""
    (root / "experiment").mkdir(parents=True)
    (root / "experiment" / "mine.yaml").write_text(RECIPE)
    (root / "model").mkdir()
    (root / "model" / "narrow.yaml").write_text(MODEL)
    return root


def typed(*overrides: str):
    reg = registry()
    return to_object(compose(list(overrides), reg), reg)


def test_train_config_dir_adds_the_directorys_options(tmp_path):
    root = recipes(tmp_path / "my recipes")
    proc = olmx_cli("train", "--dry-run", "--config-dir", str(root), "experiment=mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "max_steps: 7" in proc.stdout and "d_model: 48" in proc.stdout
    # without the directory the option is unknown
    proc = olmx_cli("train", "--dry-run", "experiment=mine", cwd=tmp_path)
    assert proc.returncode == 2 and "mine" in proc.stderr and "Traceback" not in proc.stderr


def test_a_config_dir_that_is_not_a_directory_is_refused_naming_the_flag(tmp_path):
    proc = olmx_cli("train", "--dry-run", "--config-dir", str(tmp_path / "nowhere"), "experiment=mine", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--config-dir" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_olmx_config_path_adds_directories_to_every_composition(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="experiment"):
        typed("experiment=mine")
    monkeypatch.setenv("OLMX_CONFIG_PATH", os.pathsep.join([str(tmp_path / "empty"), str(recipes(tmp_path / "r"))]))
    (tmp_path / "empty").mkdir()
    run = typed("experiment=mine")
    assert run.trainer.max_steps == 7 and run.model.d_model == 48 and run.model.n_layers == typed().model.n_layers
    # olmx's own options stay where they are
    assert typed("experiment=quickstart").model.name == "tiny"
    monkeypatch.setenv("OLMX_CONFIG_PATH", str(tmp_path / "r" / "experiment" / "mine.yaml"))
    with pytest.raises(ConfigError, match=r"OLMX_CONFIG_PATH: '.*mine.yaml' is not a directory"):
        typed()
