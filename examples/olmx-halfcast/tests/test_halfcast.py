"""Tests of olmx-halfcast: the contract, the preset, and its dtypes on each kind of mesh."""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from types import SimpleNamespace

import pytest
import yaml
from olmx_halfcast.plugin import HALFCAST, HalfcastConfig
from packaging.specifiers import SpecifierSet

import olmx
from olmx.api import Dtypes, Mesh, PrecisionPlugin, World
from olmx.errors import ConfigError

WORLD = World(nnodes=1, nproc_per_node=4)
SHARDED = Mesh(dp_replicate=1, dp_shard=4, shards_params=True)
REPLICATED = Mesh(dp_replicate=4)


def test_it_is_a_precision_plugin():
    assert isinstance(HALFCAST, PrecisionPlugin)
    assert HALFCAST.name == "halfcast" and dataclasses.is_dataclass(HALFCAST.Config)
    assert olmx.PLUGIN_API in SpecifierSet(HALFCAST.api)


def test_the_yaml_preset_holds_the_config_defaults():
    preset = yaml.safe_load((files("olmx_halfcast.conf") / "precision" / "halfcast.yaml").read_text())
    assert preset == {"name": "halfcast", **dataclasses.asdict(HalfcastConfig())}


def test_dtypes_follow_the_mesh():
    assert HALFCAST.dtypes(HalfcastConfig(), None, WORLD, SHARDED) == Dtypes(param="bfloat16", reduce="bfloat16")
    assert HALFCAST.dtypes(HalfcastConfig(), None, WORLD, REPLICATED) == Dtypes(param="bfloat16", reduce="float32")
    assert HALFCAST.dtypes(HalfcastConfig(half_reduce=False), None, WORLD, SHARDED).reduce == "float32"
    with pytest.raises(ConfigError, match="precision.require_sharding: the 4 data-parallel ranks"):
        HALFCAST.dtypes(HalfcastConfig(require_sharding=True), None, WORLD, REPLICATED)


def test_resolve_states_the_traffic():
    ctx = SimpleNamespace(
        dtypes=Dtypes(param="bfloat16", reduce="bfloat16"), world=WORLD, dtype_rows=lambda: [("compute", "bfloat16")]
    )
    assert HALFCAST.resolve(HalfcastConfig(), ctx).rows[-1] == (
        "reduction traffic",
        "half of float32's (bfloat16 reduce-scatter)",
    )
