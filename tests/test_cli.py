"""The olmx command: help, plugin listing and dry runs, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import olmx_cli


def modules_after(*argv: str) -> set[str]:
    """Modules imported by running the CLI in-process with ``argv`` (in a fresh interpreter)."""
    code = (
        "import sys\nfrom olmx.cli import app\n"
        f"try:\n    app({list(argv)!r}, prog_name='olmx')\nexcept SystemExit:\n    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return set(proc.stderr.split())


def test_help_and_version():
    assert "plugins" in olmx_cli("--help").stdout
    assert olmx_cli("--version").stdout.strip() == "olmx 0.1.0"


def test_plugins_list_imports_no_plugin_and_no_torch():
    mods = modules_after("plugins", "list")
    assert not any(m.startswith("olmx_plugins.") for m in mods if m.count(".") > 1)
    assert "torch" not in mods and "olmo_core" not in mods and "hydra" not in mods


def test_dry_run_imports_no_torch():
    mods = modules_after("train", "--dry-run")
    assert "torch" not in mods and "olmo_core" not in mods


def test_plugins_list_table_json_and_kind():
    table = olmx_cli("plugins", "list").stdout
    for name in ("ddp", "fsdp", "fp32", "bf16", "local"):
        assert name in table
    rows = json.loads(olmx_cli("plugins", "list", "--json").stdout)
    assert {(r["kind"], r["name"]) for r in rows} >= {("parallel", "ddp"), ("infra", "local")}
    assert all(r["distribution"] == "olmx" and r["version"] == "0.1.0" for r in rows if r["name"] == "fsdp")
    assert all(r["description"] for r in rows)
    parallel = json.loads(olmx_cli("plugins", "list", "--kind", "parallel", "--json").stdout)
    assert {r["kind"] for r in parallel} == {"parallel"}
    # one line per plugin, in a terminal and in a pipe: tests/test_console.py
    bad = olmx_cli("plugins", "list", "--kind", "gpu")
    assert bad.returncode == 2
    assert "--kind: 'gpu' is not one of layer, parallel, precision, infra, tracker" in bad.stderr


def test_plugins_list_check_marks_loaded_plugins_ok():
    rows = json.loads(olmx_cli("plugins", "list", "--check", "--json").stdout)
    assert {r["status"] for r in rows if r["distribution"] == "olmx"} == {"ok"}


def test_plugins_show_prints_schema_with_docs():
    out = olmx_cli("plugins", "show", "fsdp").stdout
    assert "parallel.fsdp.wrapping_strategy" in out and "'full'" in out
    assert "OLMo-core wrapping strategy" in out
    assert "select with: parallel=[fsdp]" in out
    # hsdp's config extends fsdp's: the inherited fields keep their documentation
    hsdp = olmx_cli("plugins", "show", "hsdp").stdout
    assert "OLMo-core wrapping strategy" in hsdp and "Ranks a parameter is sharded over" in hsdp
    missing = olmx_cli("plugins", "show", "zero3")
    assert missing.returncode == 2 and "unknown plugin 'zero3'; installed: " in missing.stderr
    typo = olmx_cli("plugins", "show", "fdsp")
    assert typo.returncode == 2 and typo.stderr.strip() == "error: unknown plugin 'fdsp'; did you mean 'fsdp'?"


def test_dry_run_prints_config_plan_and_launch_and_writes_nothing(tmp_path):
    proc = olmx_cli("train", "--dry-run", "trainer.max_steps=7", "parallel=[fsdp]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "max_steps: 7" in out  # the resolved YAML
    assert "2 processes = 1 node(s) x 2 (cpu)" in out
    assert "16 sequences = 4,096 tokens" in out and "8 sequences = 2,048 tokens" in out
    assert "1,148,032 total" in out
    assert "torch.distributed.run --nnodes=1 --nproc-per-node=2" in out and "-m olmx run" in out
    assert list(tmp_path.iterdir()) == []


def test_broken_plugin_never_breaks_the_cli(plugin_site):
    from tests.conftest import make_dist

    make_dist(
        plugin_site,
        "olmx-crash",
        "[olmx.infra]\ncrash = crash_mod:X\n",
        {"crash_mod": "raise SystemExit('plugin calls exit at import')\n"},
    )
    rows = json.loads(olmx_cli("plugins", "list", "--check", "--json").stdout)
    crash = next(r for r in rows if r["name"] == "crash")
    assert crash["status"] == "broken" and "plugin calls exit at import" in crash["reason"]
    assert olmx_cli("train", "--dry-run").returncode == 0


def test_plugins_list_and_show_print_one_description():
    """Both print the first line of the entry point module's docstring (bf16's class docstring,
    which show printed before, says something else)."""
    rows = {r["name"]: r for r in json.loads(olmx_cli("plugins", "list", "--json").stdout)}
    assert rows["bf16"]["description"] == "bfloat16 compute with float32 master weights and float32 gradient reduction."
    for name in ("bf16", "fsdp", "runpod"):
        first = olmx_cli("plugins", "show", name).stdout.splitlines()[0]
        assert first.endswith(f"): {rows[name]['description']}"), first
