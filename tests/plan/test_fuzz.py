"""Property-based fuzz of the plan (hypothesis): random override sets over every field of the
run config and of every installed plugin's config, on random selections of plugins, with
values that are zero, negative, huge, NaN/inf, of the wrong type, unknown choices, empty or odd
lists and odd paths. Each must end as a plan or as one ``OlmxError`` of exit code 2 whose
message is one line naming a field; never another exception.

The seed is printed (and named in a failure); ``OLMX_FUZZ_SEED=N`` replays it. The example
count keeps the test near a minute here (``OLMX_FUZZ_EXAMPLES`` raises it for a longer hunt).
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from olmx.config.schema import RunConfig
from olmx.rules import rule_of

SEED = int(os.environ.get("OLMX_FUZZ_SEED", random.randrange(2**32)))
EXAMPLES = int(os.environ.get("OLMX_FUZZ_EXAMPLES", "100"))

#: Values every field is tried with (Hydra override syntax).
ODD = [
    "0", "-1", "1", "2", "3", "7", "64", "2147483648", "1e30", "-1e-9", "0.5", "nan", "inf", "-inf",
    "null", "true", "abc", "''", "[]", "[0]", "[1,2]", "[-1]", "[0.9,2]", "[a]", "/proc/olmx",
    "auto", "{}", "[", "1,2",
]  # fmt: skip


def _fields(cls: type, prefix: str) -> list[tuple[str, list[str]]]:
    """``(key, values)`` for every field of a config dataclass, nested sections flattened;
    a field's rule adds its choices and its bounds' edges to the odd values."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += _fields(type(default), f"{prefix}{f.name}.")
            continue
        values = list(ODD)
        rule = rule_of(f)
        if rule is not None:
            values += list(rule.choices or ())
            for bound in (rule.ge, rule.gt, rule.le, rule.lt):
                if bound is not None:
                    values += [str(bound), str(bound - 1), str(bound + 1)]
        out.append((f"{prefix}{f.name}", values))
    return out


def _catalogue():
    """Core fields and, per plugin kind, each plugin's fields under its section."""
    from olmx.api import CONFIG_GROUPS
    from olmx.registry import registry

    reg = registry()
    core = [(k, v) for k, v in _fields(RunConfig, "") if k.split(".")[0] in ("model", "data", "trainer", "eval")]
    plugins: dict[str, dict[str, list[tuple[str, list[str]]]]] = {}
    for kind, group in CONFIG_GROUPS.items():
        plugins[kind] = {}
        for name in reg.names(kind):
            prefix = f"{group}." if kind == "infra" else f"{group}.{name}."
            plugins[kind][name] = _fields(reg.get(kind, name).Config, prefix)
    return core, plugins


CORE, PLUGINS = _catalogue()


@st.composite
def override_sets(draw) -> list[str]:
    """A selection of plugins and 1-4 odd field values (a few on unselected plugins)."""
    layers = draw(st.lists(st.sampled_from(sorted(PLUGINS["layer"])), max_size=2, unique=True))
    parallel = draw(st.lists(st.sampled_from([*sorted(PLUGINS["parallel"]), "auto"]), max_size=2, unique=True))
    precision = draw(st.sampled_from(sorted(PLUGINS["precision"])))
    infra = draw(st.sampled_from(sorted(PLUGINS["infra"])))
    trackers = draw(st.lists(st.sampled_from(sorted(PLUGINS["tracker"])), max_size=1))
    fields = list(CORE) + list(PLUGINS["precision"][precision]) + list(PLUGINS["infra"][infra])
    for name in layers:
        fields += PLUGINS["layer"][name]
    for name in parallel:
        fields += PLUGINS["parallel"].get(name, [])
    for name in trackers:
        fields += PLUGINS["tracker"][name]
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique_by=lambda kv: kv[0]))
    overrides = [f"layers=[{','.join(layers)}]", f"parallel=[{','.join(parallel)}]"]
    overrides += [f"precision={precision}", f"infra={infra}", f"trackers=[{','.join(trackers)}]"]
    overrides += [f"{key}={draw(st.sampled_from(values))}" for key, values in chosen]
    return overrides


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLMX_CACHE_DIR", str(root / "cache"))
    mp.setenv("RUNPOD_API_KEY", "fuzz-key-not-used")  # the plan never calls RunPod
    mp.chdir(root)
    yield root
    mp.undo()


def test_every_override_set_ends_as_a_plan_or_one_config_error(fuzz_env):
    from olmx.errors import OlmxError
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    print(f"fuzz seed {SEED} (replay: OLMX_FUZZ_SEED={SEED})")
    seen = {"plans": 0, "errors": 0}
    reg = registry()

    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(override_sets())
    def one(overrides: list[str]) -> None:
        try:
            plan_from_overrides([f"trainer.runs_root={fuzz_env / 'runs'}", *overrides], reg)
            seen["plans"] += 1
        except OlmxError as exc:
            message = str(exc)
            assert exc.exit_code == 2 and "\n" not in message and message, (SEED, overrides, message)
            seen["errors"] += 1

    try:
        one()
    except Exception as exc:  # name the seed with whatever failed
        raise AssertionError(f"fuzz seed {SEED}: {exc}") from exc
    print(f"{sum(seen.values())} override sets: {seen['plans']} plans, {seen['errors']} config errors")
    assert seen["plans"] + seen["errors"] >= EXAMPLES // 2


def test_every_mutated_saved_plan_loads_or_is_one_plan_error(fuzz_env):
    """``olmx run`` and ``olmx report`` read ``plan.yaml`` through ``Plan.load``: a saved plan
    with any one value replaced (or deleted) loads, or is refused as one ``PLAN`` line."""
    import yaml

    from olmx.plan import Plan
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry
    from tests.fuzzing import REPLACEMENTS, read_or_refuse, replaced, value_paths

    reg = registry()
    plan = plan_from_overrides(["layers=[moe]", f"trainer.run_dir={fuzz_env / 'saved'}"], reg)
    path = plan.save()
    original = yaml.safe_load(path.read_text())
    rng = random.Random(SEED)
    spots = list(value_paths(original))
    print(f"fuzz seed {SEED}: {len(spots)} values in the saved plan")
    seen = {"facts": 0, "refused": 0}
    for spot in rng.sample(spots, min(len(spots), 120)):
        new = rng.choice(REPLACEMENTS)
        path.write_text(yaml.safe_dump(replaced(original, spot, new), sort_keys=False))
        read_or_refuse(lambda: Plan.load(path, reg), "PLAN", seen, (SEED, spot, new))  # else a traceback in olmx run
    print(seen)
    assert seen["refused"] > 0
