"""The train-module hook (plugin API 3): plugins get OLMo-core's ``TransformerTrainModuleConfig``
and the model's parameter names, and a plugin's optimizer group that matches no parameter is
refused naming the plugin."""

from __future__ import annotations

import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry

ENGRAM = ["infra.nproc_per_node=1", "parallel=[]", "layers=[engram]", "layers.engram.layer_ids=[1]"]


def test_plugins_edit_the_typed_config_and_their_groups_must_match_a_parameter(tmp_path):
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    from olmx.worker.model import build_model
    from olmx.worker.train import train_module_config

    reg = registry()
    plan = plan_from_overrides([*ENGRAM, f"trainer.run_dir={tmp_path}"], reg)
    names = [n for n, _ in build_model(plan, reg).named_parameters()]
    config = train_module_config(plan, reg, names)
    assert isinstance(config, TransformerTrainModuleConfig)
    patterns = [p for group in config.optim.group_overrides for p in group.params]
    assert "embeddings.weight" in patterns and len(patterns) > 1  # the core's group, then Engram's
    # Without the tables among the model's parameters, Engram's table group matches nothing.
    tables = [n for n in names if n.endswith(".engram.table.weight")]
    assert tables
    with pytest.raises(ConfigError, match="optimizer group pattern .* matches no parameter") as err:
        train_module_config(plan, reg, [n for n in names if n not in tables])
    assert err.value.field == "layers.engram"
