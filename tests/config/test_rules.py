"""Field rules (olmx.rules): declared once next to each field, read by the one checker,
``olmx plugins show`` and the saved-plan reader."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Optional

import pytest

from olmx.errors import ConfigError
from olmx.rules import Rule, check, rule_of, setting


@pytest.mark.parametrize(
    ("rule", "text", "good", "bad"),
    [
        (Rule(ge=1, integer=True), "a positive integer", [1, 10**9], [0, -3]),
        (Rule(ge=0, integer=True), "an integer >= 0", [0, 5], [-1]),
        (Rule(gt=0), "a positive finite number", [1e-12, 3.0], [0.0, -1.0, float("nan"), float("inf")]),
        (Rule(ge=0), "a finite number >= 0", [0.0, 2.5], [-1e-9, float("nan"), float("-inf")]),
        (Rule(gt=0, le=1), "a number in (0, 1]", [1.0, 0.4], [0.0, 1.01, float("nan")]),
        (Rule(ge=2, le=1 << 20, integer=True), "an integer in [2, 1,048,576]", [2, 1 << 20], [1, (1 << 20) + 1]),
        (Rule(choices=("a", "b")), "one of a, b", ["a"], ["c", ""]),
        (Rule(ge=0, items=True, integer=True), "each an integer >= 0", [[], [0, 3]], [[0, -1]]),
        (Rule(ge=0, lt=1, length=2), "2 numbers, each a number in [0, 1)", [[0.9, 0.95]], [[0.9], [0.9, 1.0]]),
        (Rule(ge=1, also=-1, items=True, integer=True), "each a positive integer or -1", [[-1, 8], []], [[0], [-2]]),
    ],
)
def test_a_rule_says_what_it_allows_and_refuses_the_rest(rule, text, good, bad):
    assert rule.describe() == text
    assert not any(rule.refuses(v) for v in good)
    assert all(rule.refuses(v) for v in bad)


@dataclasses.dataclass
class _Inner:
    weight: float = setting(1.0, gt=0)


@dataclasses.dataclass
class _Outer:
    steps: int = setting(3, ge=1)
    label: str = "free text"
    cap: Optional[int] = setting(None, ge=1, integer=True)
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    named: dict = dataclasses.field(default_factory=dict)


def test_the_checker_walks_sections_and_named_sections_and_names_the_field():
    check(_Outer(named={"web": _Inner()}), "x")  # defaults and None pass
    cases = [
        (_Outer(steps=0), "x.steps: must be a positive integer, got 0"),
        (_Outer(cap=0), "x.cap: must be a positive integer or null, got 0"),
        (_Outer(inner=_Inner(weight=float("nan"))), "x.inner.weight: must be a positive finite number, got nan"),
        (_Outer(named={"web": _Inner(weight=-1.0)}), "x.named.web.weight: must be a positive finite number, got -1.0"),
    ]
    for config, message in cases:
        with pytest.raises(ConfigError) as info:
            check(config, "x")
        assert str(info.value) == message


@dataclasses.dataclass
class _Heads:
    width: int = setting(64, ge=1)
    heads: int = setting(4, ge=1, divides="width")
    groups: Optional[int] = setting(None, ge=1, integer=True, divides="heads")


def test_a_divisibility_between_two_fields_is_declared_once_and_checked_after_their_own_rules():
    check(_Heads(), "m")
    check(_Heads(groups=2), "m")
    assert Rule(ge=1, integer=True, divides="width").describe() == "a positive integer dividing width"
    cases = [
        (_Heads(heads=3), "m.heads: 3 must divide m.width=64"),
        (_Heads(groups=3), "m.groups: 3 must divide m.heads=4"),
        (_Heads(heads=0), "m.heads: must be a positive integer dividing width, got 0"),  # its own rule first
        (_Heads(width=0, heads=3), "m.width: must be a positive integer, got 0"),  # never 0 % 3
    ]
    for config, message in cases:
        with pytest.raises(ConfigError) as info:
            check(config, "m")
        assert str(info.value) == message


#: Fields whose values are free (names, paths, URLs, dtypes checked with the precision rules,
#: a seed, switches): everything else that is a number, a string or a list declares a rule.
FREE = {
    "name", "path", "paths", "cache_dir", "run_dir", "runs_root", "init_from",
    "compile", "degree", "param_dtype", "reduce_dtype", "exclude", "dir", "project", "entity", "group", "tags",
    "notes", "base_url", "master_addr", "data", "gpu_type", "gpu_types", "cpu_flavor", "image", "min_cuda_version",
    "flash_attn_wheel", "network_volume_id", "cloud", "data_centers", "pass_env", "pod_name", "pod_id",
    "cluster_id", "workdir", "python", "ssh_key", "mounts", "env", "gpu_name",
    "partition", "account", "time", "mem", "container_image", "container_mounts", "extra_sbatch_args", "job_name",
    "tracking_uri", "experiment", "run_name", "downstream", "source", "layout", "ran_on",
}  # fmt: skip


def _optional_dataclass(tp: object) -> type | None:
    """The dataclass of an ``Optional[dataclass]`` annotation, else None."""
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]) else None


def _unruled(cls: type, prefix: str) -> list[str]:
    import typing

    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        nested = type(default) if dataclasses.is_dataclass(default) else _optional_dataclass(hints.get(f.name))
        if nested is not None:  # a section, or an optional one (data.instance_filter: null)
            out += _unruled(nested, f"{prefix}{f.name}.")
        elif not isinstance(default, (bool, dict)) and rule_of(f) is None and f.name not in FREE:
            out.append(f"{prefix}{f.name}")
    return out


def test_every_numeric_or_choice_field_declares_its_rule():
    """The run config's and every first-party plugin's fields: a number, a choice or a list of
    numbers has its rule next to it (this is what keeps the checks in one place)."""
    from olmx.api import CONFIG_GROUPS
    from olmx.config.schema import RunConfig
    from olmx.registry import registry

    reg = registry()
    missing = _unruled(RunConfig, "")
    for kind, group in CONFIG_GROUPS.items():
        for entry in reg.entries(kind):
            if entry.dist == "olmx":
                missing += _unruled(reg.get(kind, entry.name).Config, f"{group}.{entry.name}.")
    assert not missing


def test_plugins_show_prints_the_rules():
    out = subprocess.run(
        [sys.executable, "-m", "olmx", "plugins", "show", "moe"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert "allowed" in out.stdout and "one of softmax, sigmoid" in out.stdout
    assert "Optional[int]" in out.stdout  # rich no longer eats "[int]" as a style


def test_a_hand_edited_saved_plan_is_held_to_the_same_rules(tmp_path):
    import yaml

    from olmx.plan import Plan
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    plan = plan_from_overrides([f"trainer.run_dir={tmp_path / 'run'}"], reg)
    path = plan.save()
    data = yaml.safe_load(path.read_text())
    data["config"]["trainer"]["lr"] = -1.0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as info:
        Plan.load(path, reg)
    assert "config.trainer.lr: must be a positive finite number, got -1.0" in str(info.value)
