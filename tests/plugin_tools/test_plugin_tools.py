"""Plugin tools: the generated skeletons (installed for real, their own tests run), ``olmx
plugins check`` on a catalogue of broken packages, and the ``olmx.conf`` search path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import olmx
from olmx.config.search_path import conf_search_paths, with_conf_search_paths
from olmx.errors import ConfigError
from olmx.plugin_tools.check import check_plugin
from olmx.plugin_tools.names import entry_point_toml, plugin_names
from olmx.plugin_tools.scaffold import new_plugin
from tests.conftest import make_dist, olmx_cli

KINDS = ("layer", "parallel", "precision", "infra", "tracker")


def pip_install(*packages: Path, target: Path) -> None:
    """A real, offline, non-editable ``pip install`` of local packages into ``target`` (put it
    on PYTHONPATH). setuptools comes with torch, so ``--no-build-isolation`` needs no network."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            *map(str, packages),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def site_env(site: Path) -> dict[str, str]:
    """Environment of a subprocess that sees the packages installed in ``site``."""
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


# ----------------------------------------------------------------------------- names


def test_plugin_names_derive_every_name():
    n = plugin_names("my-thing")
    assert (n.name, n.dist, n.module, n.title, n.const) == (
        "my_thing",
        "olmx-my-thing",
        "olmx_my_thing",
        "MyThing",
        "MY_THING",
    )
    assert plugin_names("olmx-my_thing") == n


@pytest.mark.parametrize("bad", ["1thing", "my--thing", "my thing", "thing-", "import", ""])
def test_bad_plugin_names_are_refused(bad):
    with pytest.raises(ConfigError, match="NAME"):
        plugin_names(bad)


def test_entry_point_lines_are_written_and_validated_by_entry_points_txt():
    import entry_points_txt as ept

    assert (
        entry_point_toml("olmx.layers", "my_thing", "olmx_my_thing.plugin:MY_THING")
        == 'my_thing = "olmx_my_thing.plugin:MY_THING"'
    )
    assert entry_point_toml("olmx.conf", "my_thing", "olmx_my_thing.conf") == 'my_thing = "olmx_my_thing.conf"'
    with pytest.raises(ept.ParseError):
        entry_point_toml("olmx.layers", "x", "not-a-module:X")


def test_new_refuses_a_taken_name_a_bad_kind_and_a_full_directory(tmp_path):
    with pytest.raises(ConfigError, match="'ddp' is already a parallel plugin"):
        new_plugin("ddp", kind="parallel", directory=tmp_path / "a")
    with pytest.raises(ConfigError, match="--kind: 'layers' is not one of layer, parallel, precision, infra, tracker"):
        new_plugin("x", kind="layers", directory=tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "file").write_text("")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        new_plugin("x", kind="layer", directory=tmp_path / "c")


# ----------------------------------------------------------------------------- skeletons


@pytest.fixture(scope="module")
def skeletons(tmp_path_factory):
    """One generated package per kind (the layer one through the real CLI), all installed."""
    root = tmp_path_factory.mktemp("skeletons")
    dirs = {"layer": root / "olmx-my-layer"}
    proc = olmx_cli("plugins", "new", "my-layer", "--kind", "layer", "--dir", str(dirs["layer"]))
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and "pip install -e" in proc.stdout
    for kind in KINDS[1:]:
        dirs[kind] = new_plugin(f"my-{kind}", kind=kind, directory=root / f"olmx-my-{kind}")
    site = root / "site"
    pip_install(*dirs.values(), target=site)
    return dirs, site_env(site)


@pytest.mark.parametrize("kind", KINDS)
def test_skeleton_is_a_complete_package(skeletons, kind):
    from olmx.api import CONFIG_GROUPS, GROUPS

    path = skeletons[0][kind]
    module = f"olmx_my_{kind}"
    files = {
        str(p.relative_to(path))
        for p in path.rglob("*")
        if p.is_file() and "build" not in p.parts and ".egg-info" not in str(p)
    }
    assert files == {
        "pyproject.toml",
        "README.md",
        f"{module}/__init__.py",
        f"{module}/plugin.py",
        f"{module}/py.typed",
        f"{module}/conf/__init__.py",
        f"{module}/conf/{CONFIG_GROUPS[kind]}/my_{kind}.yaml",
        f"tests/test_{module}.py",
    }
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    assert project["name"] == f"olmx-my-{kind}"
    assert project["dependencies"] == ["olmx>=0.1"]
    assert project["entry-points"] == {
        GROUPS[kind]: {f"my_{kind}": f"{module}.plugin:MY_{kind.upper()}"},
        "olmx.conf": {f"my_{kind}": f"{module}.conf"},
    }
    assert f'api = ">={olmx.PLUGIN_API},<4"' in (path / module / "plugin.py").read_text()


def test_skeletons_pass_their_own_tests_once_installed(skeletons):
    dirs, env = skeletons
    # One pytest run over the five packages' tests (each file is named after its package).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "-rs",
            *(str(d / "tests") for d in dirs.values()),
        ],
        cwd=dirs["layer"].parent,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for kind in KINDS:
        passed = [
            line for line in proc.stdout.splitlines() if f"test_olmx_my_{kind}.py::" in line and " PASSED" in line
        ]
        assert len(passed) == (6 if kind == "infra" else 4), proc.stdout
    assert "22 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_skeleton_passes_plugins_check(skeletons, kind):
    assert check_plugin(str(skeletons[0][kind])) == []


def test_installed_skeletons_are_listed_and_load(skeletons):
    _, env = skeletons
    proc = olmx_cli("plugins", "list", "--json", "--check", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    for kind in KINDS:
        row = rows[f"my_{kind}"]
        assert (row["kind"], row["distribution"], row["status"]) == (kind, f"olmx-my-{kind}", "ok"), row
        assert row["description"].startswith(f"My{kind.capitalize()}: a")
    assert not [r for r in rows.values() if r["status"] == "shadowed"]


def test_installed_skeleton_is_used_by_train_dry_run(skeletons, tmp_path):
    _, env = skeletons
    proc = olmx_cli(
        "train",
        "layers=[my_layer]",
        "layers.my_layer.blocks=[1,3]",
        "precision=my_precision",
        "precision.autocast=true",
        "infra=my_infra",
        "trackers=[my_tracker]",
        f"trainer.run_dir={tmp_path}",
        "--dry-run",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "layers.my_layer" in out and "trackers.my_tracker" in out
    assert "precision:\n  name: my_precision\n  autocast: true" in out  # one flat section
    assert "│   blocks" in out and "1, 3" in out
    assert "--nproc-per-node=2" in out and "olmx run" in out  # infra=my_infra's dry run
    proc = olmx_cli("provision", "my_infra", "world", "--nproc-per-node", "3", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nproc_per_node=3" in proc.stdout
    proc = olmx_cli("plugins", "check", "olmx-my-layer", env=env)  # by installed distribution name
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout


# ----------------------------------------------------------------------------- check: a catalogue of defects

LAYER = """
    '''A third-party layer.'''
    from dataclasses import dataclass
    from olmx.api import Contribution, LayerPlugin

    @dataclass
    class Cfg:
        #: a knob
        width: int = 3

    class Thing(LayerPlugin):
        name = "thing"
        description = "A third-party layer."
        api = ">=3.0,<4"
        Config = Cfg
        def resolve(self, cfg, ctx): return Contribution(params=cfg.width)
        def apply_model_config(self, cfg, model_config, plan): return model_config
        def apply_model(self, cfg, model, plan): pass

    PLUGIN = Thing()
"""

ENTRY = '[project.entry-points."olmx.layers"]\nthing = "thing_mod:PLUGIN"\n'


def write_package(
    root: Path,
    *,
    entry_points: str = ENTRY,
    module: str = LAYER,
    dependencies: str = '["olmx>=0.1"]',
    files: dict[str, str] | None = None,
    extra: str = "",
) -> Path:
    """A plugin source tree (pyproject.toml + ``thing_mod.py`` + ``files``) in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "olmx-thing"\nversion = "0.1.0"\ndependencies = {dependencies}\n{extra}\n'
        + textwrap.dedent(entry_points)
    )
    (root / "thing_mod.py").write_text(textwrap.dedent(module))
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


CONF = '[project.entry-points."olmx.conf"]\nthing = "thing_conf"\n'
CONF_INIT = {"thing_conf/__init__.py": ""}

DEFECTS = {
    "unknown group": (
        dict(entry_points=ENTRY.replace("olmx.layers", "olmx.layer")),
        "[olmx.layer]: unknown olmx group; olmx reads olmx.layers, olmx.parallel",
    ),
    "malformed line": (
        dict(entry_points=ENTRY.replace("thing_mod", "thing-mod")),
        "olmx.layers: thing = thing-mod:PLUGIN: malformed line: Invalid module name",
    ),
    "name not an identifier": (
        dict(entry_points=ENTRY.replace("thing =", '"my-thing" =')),
        (
            "olmx.layers:my-thing: 'my-thing' is the Hydra option name and config key: "
            "it must be a Python identifier (e.g. my_thing)"
        ),
    ),
    "module instead of object": (
        dict(entry_points=ENTRY.replace(":PLUGIN", "")),
        "it must name the plugin object (module:OBJECT)",
    ),
    "missing dependency": (
        dict(module="import olmx_dependency_not_installed\n" + textwrap.dedent(LAYER)),
        "olmx.layers:thing: ModuleNotFoundError: No module named 'olmx_dependency_not_installed'",
    ),
    "exception at import": (
        dict(module="raise RuntimeError('boom at import')\n"),
        "olmx.layers:thing: RuntimeError: boom at import",
    ),
    "exit at import": (dict(module="import sys\nsys.exit(3)\n"), "olmx.layers:thing: SystemExit: 3"),
    "process killed at import": (dict(module="import os\nos._exit(9)\n"), "olmx-thing: the import probe died"),
    "torch imported at module level": (
        dict(module="import torch\n" + textwrap.dedent(LAYER), files={"torch.py": '"""A stand-in torch."""\n'}),
        "importing thing_mod imports torch; olmx loads every plugin",
    ),
    "missing object": (
        dict(entry_points=ENTRY.replace(":PLUGIN", ":PLUGGIN")),
        "AttributeError: module 'thing_mod' has no attribute 'PLUGGIN'",
    ),
    "not a plugin object": (dict(module="PLUGIN = 42\n"), "missing attribute 'name' of the layer plugin contract"),
    "not a LayerPlugin": (
        dict(module=LAYER.replace("class Thing(LayerPlugin):", "class Thing:")),
        "not an instance of olmx.api.LayerPlugin (the layer plugin contract)",
    ),
    "hook with the wrong parameters": (
        dict(module=LAYER.replace("def apply_model(self, cfg, model, plan)", "def apply_model(self, cfg, model)")),
        "apply_model takes 2 argument(s), the contract passes 3",
    ),
    "name differs from entry point": (
        dict(module=LAYER.replace('name = "thing"', 'name = "other"')),
        "object is named 'other' but registered as 'thing'",
    ),
    "config not a dataclass": (
        dict(module=LAYER.replace("Config = Cfg", "Config = dict")),
        "Config must be a dataclass",
    ),
    "incompatible plugin API": (
        dict(module=LAYER.replace('api = ">=3.0,<4"', 'api = ">=4.0"')),
        f"olmx.layers:thing: plugin supports olmx plugin API '>=4.0', this olmx has {olmx.PLUGIN_API}",
    ),
    "clash with a first-party plugin": (
        dict(
            entry_points=ENTRY.replace("olmx.layers", "olmx.parallel").replace("thing =", "ddp ="),
            module=LAYER.replace('name = "thing"', 'name = "ddp"'),
        ),
        "olmx.parallel:ddp: clashes with the parallel plugin 'ddp' of olmx 0.1.0 (first party, it wins)",
    ),
    "olmx version excluded": (dict(dependencies='["olmx<0.1"]'), "olmx<0.1: excludes this olmx 0.1.0"),
    "no dependency on olmx": (dict(dependencies="[]"), "olmx-thing: does not depend on olmx"),
    "no olmx entry point": (
        dict(entry_points='[project.scripts]\nthing = "thing_mod:main"\n'),
        "declares no entry point in an olmx group",
    ),
    "dynamic entry points": (
        dict(extra='dynamic = ["entry-points"]', entry_points=""),
        "pyproject.toml: entry points are dynamic",
    ),
    "conf names an object": (
        dict(entry_points=ENTRY + CONF.replace('"thing_conf"', '"thing_conf:YAML"')),
        "an olmx.conf value names a package holding YAML (module only",
    ),
    "conf package missing": (
        dict(entry_points=ENTRY + CONF),
        "olmx.conf:thing: no package 'thing_conf': the olmx.conf value must be a package",
    ),
    "conf package without YAML": (
        dict(entry_points=ENTRY + CONF, files=CONF_INIT),
        "package 'thing_conf' holds no YAML",
    ),
    "conf YAML invalid": (
        dict(entry_points=ENTRY + CONF, files={**CONF_INIT, "thing_conf/layers/thing.yaml": "thing: [unclosed\n"}),
        "layers/thing.yaml is not valid YAML",
    ),
    "conf YAML hidden by olmx's own": (
        dict(entry_points=ENTRY + CONF, files={**CONF_INIT, "thing_conf/model/tiny.yaml": "d_model: 8\n"}),
        "olmx's own conf/model/tiny.yaml takes precedence",
    ),
    "conf YAML replaces another plugin's option": (
        dict(entry_points=ENTRY + CONF, files={**CONF_INIT, "thing_conf/parallel/ddp.yaml": "ddp: {}\n"}),
        "would replace the option 'ddp' of the parallel plugin from olmx",
    ),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_check_catches(defect, tmp_path):
    kwargs, expected = DEFECTS[defect]
    problems = check_plugin(str(write_package(tmp_path / "pkg", **kwargs)))
    assert any(expected in p for p in problems), problems


def test_check_catches_a_clash_with_an_installed_third_party_plugin(tmp_path, plugin_site):
    make_dist(plugin_site, "olmx-other", "[olmx.layers]\nthing = other_mod:PLUGIN\n", {"other_mod": LAYER})
    problems = check_plugin(str(write_package(tmp_path / "pkg")))
    assert problems == [
        ("olmx.layers:thing: clashes with the layer plugin 'thing' of olmx-other 0.1.0 (installed first, it wins)")
    ]


def test_check_reports_every_malformed_line_of_an_entry_points_file(tmp_path):
    wheel = build_wheel(
        tmp_path,
        entry_points="[olmx.layers]\nthing = thing_mod:PLUGIN\nthing = thing_mod:PLUGIN\n"
        "bad = bad mod:X\n[olmx-layers]\nx = y:z\n[olmx.layers\n",
    )
    problems = check_plugin(str(wheel))
    assert problems == [
        "olmx.layers:thing: declared twice (the last one would silently win)",
        "olmx.layers: bad = bad mod:X: malformed line: Invalid module name: 'bad mod'",
        "line 5: malformed group header '[olmx-layers]': Invalid group name: 'olmx-layers'",
        "line 6: 'x = y:z' is not under a valid [group] header",
        "line 7: malformed group header '[olmx.layers': Group header missing closing bracket",
    ]


def build_wheel(
    root: Path, *, entry_points: str = "[olmx.layers]\nthing = thing_mod:PLUGIN\n", module: str = LAYER
) -> Path:
    """A pure-Python wheel of ``olmx-thing`` written by hand (a zip with a ``.dist-info``)."""
    wheel = root / "olmx_thing-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("thing_mod.py", textwrap.dedent(module))
        zf.writestr(
            "olmx_thing-0.1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: olmx-thing\nVersion: 0.1.0\nRequires-Dist: olmx>=0.1\n",
        )
        zf.writestr("olmx_thing-0.1.0.dist-info/entry_points.txt", entry_points)
        zf.writestr("olmx_thing-0.1.0.dist-info/RECORD", "")
    return wheel


def test_check_reads_a_wheel_without_installing_it(tmp_path):
    assert check_plugin(str(build_wheel(tmp_path))) == []
    assert "thing_mod" not in sys.modules
    broken = build_wheel(tmp_path, module=LAYER.replace('api = ">=3.0,<4"', 'api = "<1.0"'))
    assert check_plugin(str(broken)) == [
        f"olmx.layers:thing: plugin supports olmx plugin API '<1.0', this olmx has {olmx.PLUGIN_API}"
    ]


def test_check_reads_an_installed_distribution_by_name(plugin_site):
    make_dist(
        plugin_site,
        "olmx-thing",
        "[olmx.layers]\nthing = thing_mod:PLUGIN\n",
        {"thing_mod": LAYER},
        requires=["olmx>=0.1"],
    )
    assert check_plugin("olmx-thing") == []  # its own name is no clash
    with pytest.raises(ConfigError, match="TARGET: 'olmx-not-installed' is not a source tree"):
        check_plugin("olmx-not-installed")


def test_check_command_prints_a_table_and_sets_the_exit_code(tmp_path):
    good = write_package(tmp_path / "good")
    proc = olmx_cli("plugins", "check", str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "olmx plugins check: olmx-thing 0.1.0" in proc.stdout and "all checks passed" in proc.stdout
    bad = write_package(tmp_path / "bad", module=LAYER.replace('api = ">=3.0,<4"', 'api = ">=4.0"'))
    proc = olmx_cli("plugins", "check", str(bad))
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "1 problem(s); nothing was installed." in proc.stdout


# ----------------------------------------------------------------------------- olmx.conf search path


def conf_dist(site: Path, *, init: str = "") -> None:
    """An installed layer plugin ``thing`` whose package ``thing_conf`` holds a preset."""
    make_dist(
        site,
        "olmx-thing",
        "[olmx.layers]\nthing = thing_mod:PLUGIN\n[olmx.conf]\nthing = thing_conf\nbad = thing_conf:NOT_A_PACKAGE\n",
        {"thing_mod": LAYER, "thing_conf.__init__": init},
    )
    (site / "thing_conf" / "layers").mkdir(parents=True)
    (site / "thing_conf" / "layers" / "thing_wide.yaml").write_text("thing:\n  width: 9\n")


def test_conf_search_paths_locate_packages_without_importing_them(plugin_site, monkeypatch):
    conf_dist(plugin_site, init="raise RuntimeError('a conf package must not be imported')\n")
    assert conf_search_paths() == [f"file://{plugin_site / 'thing_conf'}"]  # the invalid value is skipped
    monkeypatch.setenv("OLMX_PLUGINS", "none")
    assert conf_search_paths() == []
    monkeypatch.setenv("OLMX_PLUGINS", "olmx-thing")
    assert conf_search_paths() == [f"file://{plugin_site / 'thing_conf'}"]
    monkeypatch.delenv("OLMX_PLUGINS")
    assert "thing_conf" not in sys.modules
    assert with_conf_search_paths(["model.d_model=8"]) == [
        f"hydra.searchpath=['file://{plugin_site / 'thing_conf'}']",
        "model.d_model=8",
    ]
    merged = with_conf_search_paths(["hydra.searchpath=[pkg://mine.conf]", "x=1"])
    assert merged == [f"hydra.searchpath=['pkg://mine.conf','file://{plugin_site / 'thing_conf'}']", "x=1"]


def test_plugin_presets_join_the_config_tree(plugin_site):
    from olmx.config.compose import compose, to_object
    from olmx.registry import Registry

    conf_dist(plugin_site, init="raise RuntimeError('a conf package must not be imported')\n")
    reg = Registry.discover()
    run = to_object(compose(["layers=[thing_wide]"], reg), reg)
    assert run.layers["thing"].width == 9
    run = to_object(compose(["layers=[thing_wide]", "layers.thing.width=4"], reg), reg)
    assert run.layers["thing"].width == 4
