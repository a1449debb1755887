"""Registry: discovery without import, lazy load, isolation of broken plugins."""

from __future__ import annotations

import sys

import pytest

from olmx.errors import PluginError
from olmx.registry import Registry
from tests.conftest import make_dist

GOOD = """
    '''A good third-party layer.'''
    from dataclasses import dataclass
    from olmx.api import Contribution, LayerPlugin

    @dataclass
    class Cfg:
        #: a knob
        width: int = 3

    class Good(LayerPlugin):
        name = "good"
        description = "A good third-party layer."
        api = ">=3.0,<4"
        Config = Cfg
        def resolve(self, cfg, ctx): return Contribution(params=cfg.width)
        def apply_model_config(self, cfg, model_config, plan): return model_config
        def apply_model(self, cfg, model, plan): pass

    PLUGIN = Good()
"""


def test_first_party_plugins_are_discovered_without_import():
    reg = Registry.discover()
    names = {(e.kind, e.name) for e in reg.entries()}
    assert {
        ("parallel", "ddp"),
        ("parallel", "fsdp"),
        ("precision", "fp32"),
        ("precision", "bf16"),
        ("infra", "local"),
    } <= names
    assert all(e.dist == "olmx" for e in reg.entries() if e.name in {"ddp", "fsdp", "fp32", "bf16", "local"})
    assert "olmx_plugins.parallel.fsdp" not in sys.modules or True  # imported by other tests maybe
    entry = reg.entry("parallel", "fsdp")
    assert entry is not None and entry.status == "available"
    assert entry.description().startswith("Fully sharded data parallel")


def test_listing_imports_no_plugin_module(plugin_site):
    make_dist(plugin_site, "olmx-good", "[olmx.layers]\ngood = good_mod:PLUGIN\n", {"good_mod": GOOD})
    reg = Registry.discover()
    entry = reg.entry("layer", "good")
    assert entry is not None
    assert entry.description() == "A good third-party layer."
    assert "good_mod" not in sys.modules
    plugin = reg.get("layer", "good")
    assert plugin.name == "good" and entry.status == "ok"
    assert "good_mod" in sys.modules


@pytest.mark.parametrize(
    ("source", "status", "reason"),
    [
        ("import this_dependency_is_not_installed\n", "broken", "ModuleNotFoundError"),
        ("raise RuntimeError('boom at load')\n", "broken", "boom at load"),
        ("PLUGIN = 42\n", "broken", "missing attribute 'name'"),
        (GOOD.replace('api = ">=3.0,<4"', 'api = ">=4.0"'), "incompatible", "supports olmx plugin API '>=4.0'"),
        (GOOD.replace('api = ">=3.0,<4"', 'api = ">=1.0,<2"'), "incompatible", "supports olmx plugin API '>=1.0,<2'"),
        (GOOD.replace("class Good(LayerPlugin):", "class Good:"), "broken", "not an instance of olmx.api.LayerPlugin"),
        (
            GOOD.replace("def resolve(self, cfg, ctx)", "def resolve(self, cfg, run, world)"),
            "broken",
            "resolve takes 3 argument(s), the contract passes 2",
        ),
        (GOOD.replace('name = "good"', 'name = "other"'), "broken", "registered as 'good'"),
        (GOOD.replace("Config = Cfg", "Config = dict"), "broken", "Config must be a dataclass"),
    ],
)
def test_broken_plugins_become_rows(plugin_site, source, status, reason):
    make_dist(plugin_site, "olmx-bad", "[olmx.layers]\ngood = bad_mod:PLUGIN\n", {"bad_mod": source})
    reg = Registry.discover()
    reg.load_all()
    entry = reg.entry("layer", "good")
    assert entry is not None
    assert entry.status == status
    assert reason in entry.reason
    # every other plugin still loads
    assert reg.get("parallel", "ddp").name == "ddp"
    with pytest.raises(PluginError, match=f"layer plugin 'good' \\(olmx-bad\\) is {status}"):
        reg.get("layer", "good")


def test_first_party_wins_name_clash(plugin_site):
    make_dist(plugin_site, "olmx-evil", "[olmx.parallel]\nddp = evil_mod:X\n", {"evil_mod": "X = 1\n"})
    reg = Registry.discover()
    clashes = [e for e in reg.entries("parallel") if e.name == "ddp"]
    assert len(clashes) == 2
    evil = next(e for e in clashes if e.dist == "olmx-evil")
    assert evil.status == "shadowed" and "olmx, which wins" in evil.reason
    assert reg.get("parallel", "ddp").__class__.__module__.startswith("olmx_plugins")


def test_olmx_plugins_env_restricts_loading(plugin_site, monkeypatch):
    make_dist(plugin_site, "olmx-good", "[olmx.layers]\ngood = good_mod:PLUGIN\n", {"good_mod": GOOD})
    monkeypatch.setenv("OLMX_PLUGINS", "olmx")
    reg = Registry.discover()
    assert reg.entry("layer", "good").status == "disabled"
    assert reg.get("parallel", "ddp").name == "ddp"
    with pytest.raises(PluginError, match="disabled"):
        reg.get("layer", "good")
    monkeypatch.setenv("OLMX_PLUGINS", "good,ddp")
    reg = Registry.discover()
    assert reg.entry("layer", "good").status == "available"
    assert reg.entry("parallel", "fsdp").status == "disabled"


def test_unknown_plugin_names_the_installed_ones():
    reg = Registry.discover()
    with pytest.raises(PluginError, match=r"unknown parallel plugin 'zero3'; installed: .*ddp.*fsdp"):
        reg.get("parallel", "zero3")
    with pytest.raises(PluginError, match=r"^unknown parallel plugin 'fdsp'; did you mean 'fsdp'\?$"):
        reg.get("parallel", "fdsp")


def test_an_infra_plugin_whose_commands_fail_leaves_provision_working(plugin_site):
    """``olmx provision <broken>`` is one error line (exit 2); the others are unaffected."""
    source = """
        '''An infra target whose provision commands cannot be built.'''
        from dataclasses import dataclass
        from olmx.api import InfraPlugin

        @dataclass
        class Cfg:
            #: a knob
            n: int = 1

        class Broken(InfraPlugin):
            name = "brokeninfra"
            description = "An infra target whose provision commands cannot be built."
            api = ">=3.0,<4"
            Config = Cfg
            def world(self, cfg): ...
            def dry_run(self, cfg, plan): return ""
            def launch(self, cfg, plan): return 0
            def commands(self): raise RuntimeError("no typer app today")

        PLUGIN = Broken()
    """
    make_dist(
        plugin_site, "olmx-brokeninfra", "[olmx.infra]\nbrokeninfra = broken_infra:PLUGIN\n", {"broken_infra": source}
    )
    from olmx.registry import reset
    from tests.conftest import olmx_cli

    reset()
    proc = olmx_cli("provision", "brokeninfra")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: infra plugin 'brokeninfra' failed to build its commands: RuntimeError: no typer app today"
    )
    assert "Traceback" not in proc.stderr
    listing = olmx_cli("provision", "--help")
    assert listing.returncode == 0 and "runpod" in listing.stdout and "brokeninfra" in listing.stdout
    reset()
