"""Hydra composition and typing of the run config."""

from __future__ import annotations

import pytest

from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError
from olmx.registry import registry


def typed(*overrides: str):
    reg = registry()
    return to_object(compose(list(overrides), reg), reg)


def test_default_composes_to_the_embedded_run():
    run = typed()
    assert run.model.name == "tiny" and run.data.name == "stdlib"
    assert list(run.parallel) == ["ddp"] and run.layers == {}
    assert run.precision_name == "auto" and run.infra_name == "local"
    assert run.infra["local"].nproc_per_node is None


def test_overrides_use_hydra_grammar():
    run = typed(
        "model=olmo3_1b",
        "trainer.max_steps=50",
        "data.seq_len=512",
        "parallel=[fsdp]",
        "+extra.key=1",
        "parallel.fsdp.wrapping_strategy=blocks",
    )
    assert run.model.d_model == 2048 and run.model.block == "reordered_norm"
    assert run.trainer.max_steps == 50 and run.data.seq_len == 512
    assert list(run.parallel) == ["fsdp"] and run.parallel["fsdp"].wrapping_strategy == "blocks"
    assert run.extra == {"key": 1}


def test_deleting_a_key_restores_its_default():
    from olmx.config.schema import TrainerConfig

    assert typed("experiment=quickstart").trainer.max_steps == 100
    assert typed("experiment=quickstart", "~trainer.max_steps").trainer.max_steps == TrainerConfig.max_steps


def test_empty_parallel_list_and_infra_settings():
    run = typed("parallel=[]", "infra.nproc_per_node=1")
    assert run.parallel == {} and run.infra["local"].nproc_per_node == 1


def test_a_plugins_mapping_setting_takes_new_keys_as_any_field():
    """``infra.env`` (a ``dict`` setting) is set whole or by key, without Hydra's ``+``."""
    assert typed("infra=runpod", "infra.env={A: b, N: 3}").infra["runpod"].env == {"A": "b", "N": "3"}
    assert typed("infra=runpod", "infra.env.A=b").infra["runpod"].env == {"A": "b"}
    assert typed("trackers=[mlflow]", "trackers.mlflow.tags.team=nlp").trackers["mlflow"].tags == {"team": "nlp"}


def test_experiment_is_a_complete_recipe():
    run = typed("experiment=quickstart")
    assert run.trainer.max_steps == 100 and list(run.parallel) == ["ddp"]


def test_plugin_sections_are_typed_by_the_plugin_config():
    from olmx_plugins.parallel.fsdp import FSDPConfig

    run = typed("parallel=[fsdp]")
    assert isinstance(run.parallel["fsdp"], FSDPConfig)


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        (["model=nope"], "model", "unknown option 'nope'; allowed: "),
        (["trainer.stepz=5"], "trainer.stepz", "unknown key 'stepz' of trainer; allowed: activation_checkpointing,"),
        (["trainer.max_step=5"], "trainer.max_step", "unknown key 'max_step' of trainer; did you mean 'max_steps'?"),
        (["model=olmo3_7bb"], "model", "unknown option 'olmo3_7bb'; did you mean 'olmo3_7b'?"),
        (["foo.bar=1"], "foo.bar", "no such key; to add a new key write +foo.bar=VALUE"),
        (
            ["parallel.fsdp.wrap=x"],
            "parallel.fsdp.wrap",
            "unknown key 'wrap' of parallel.fsdp; did you mean 'wrapping_strategy'? fsdp is not selected either",
        ),
        (
            ["data.tokenizer.nmae=x"],
            "data.tokenizer.nmae",
            "key 'nmae' of data.tokenizer; did you mean 'name'?",
        ),
        (["trainer.max_steps=abc"], "trainer.max_steps", "abc"),
        (["parallel=[zero3]"], "parallel", "unknown option 'zero3'"),
        (["+trainer.max_steps=5"], "trainer.max_steps", "already exists"),
        (["trainer.lr=1e-3,3e-4"], "trainer.lr", "looks like a sweep"),
        (["--cfg"], "--cfg", "not an olmx option"),
    ],
)
def test_composition_errors_name_the_field(overrides, field, text):
    with pytest.raises(ConfigError) as info:
        typed(*overrides)
    assert info.value.field == field
    assert text in str(info.value)


def test_a_recipes_layout_applies_unless_the_user_lays_the_run_out():
    """``recipe.layout`` (OLMo 3 32B: micro-batch 1, budget checkpointing, HSDP of 64): composed in
    as given; a strategy the user chooses drops the recipe's strategy settings, not its
    micro-batch or checkpointing; ``parallel=auto`` also leaves the checkpointing to auto; a
    setting the user gives wins."""

    def run(*overrides: str):
        return to_object(compose(["experiment=olmo3_32b", "data.paths=[/x.npy]", *overrides], registry()), registry())

    recipe = run()
    assert (list(recipe.parallel), recipe.parallel["hsdp"].shard_degree) == (["hsdp"], 64)
    assert (recipe.trainer.micro_batch_size, recipe.trainer.activation_checkpointing) == (1, "budget")
    fsdp = run("parallel=[fsdp]")
    assert list(fsdp.parallel) == ["fsdp"] and fsdp.trainer.activation_checkpointing == "budget"
    auto = run("parallel=auto")
    assert auto.trainer.activation_checkpointing is None and auto.trainer.micro_batch_size == 1
    own = run("parallel=auto", "trainer.activation_checkpointing=full", "trainer.micro_batch_size=2")
    assert (own.trainer.activation_checkpointing, own.trainer.micro_batch_size) == ("full", 2)
