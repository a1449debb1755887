"""Shared fixtures: fresh Hydra/registry state, fake plugin distributions, CLI runners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OLMX = [sys.executable, "-m", "olmx"]


def pytest_configure(config):
    """Ctrl-C works in the tests however pytest was started. A shell without job control starts
    background commands (``cmd &``, nohup, some CI runners) with SIGINT ignored, and the children
    inherit that: ``_thread.interrupt_main`` then does nothing and a test's SIGINT to ``olmx
    train`` is lost. A Python handler, unlike SIG_IGN, is reset to the default on exec, so the
    CLI processes the tests start handle Ctrl-C as they do from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, which rich
    # reads once, when olmx.cli builds its consoles: the tests that set COLUMNS for the CLI
    # they invoke in-process would still get 80 columns. Without them, as in a plain pytest
    # run, rich asks the environment at each print.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``: one worker per core) the tests of the one local Slurm
    cluster run on one worker, one after another: its node takes one job at a time."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    """Each test sees a freshly discovered registry and an uninitialised Hydra."""
    from hydra.core.global_hydra import GlobalHydra

    from olmx import registry

    monkeypatch.delenv("OLMX_PLUGINS", raising=False)
    registry.reset()
    GlobalHydra.instance().clear()
    yield
    registry.reset()
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The run directory of one uninterrupted 2-process DDP run of ``tests.test_training.SMALL``
    for ``REFERENCE_STEPS`` (12 steps, checkpoints at 4, 8 and 12), trained once per session:
    the reference that the parity, resume, fault and export tests compare with. Read it only."""
    from tests.test_training import REFERENCE_STEPS, train

    root = tmp_path_factory.mktemp("reference")
    train(root / "run", {"OLMX_CACHE_DIR": str(root / "cache")}, *REFERENCE_STEPS)
    return root / "run"


def script_module(relative: str, name: str):
    """A script of the repository (``benchmarks/gpu/smoke.py``: scripts are not packages) as a
    module, loaded once under ``name`` (its dataclasses look their module up in sys.modules)."""
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / relative)
        assert spec is not None and spec.loader is not None, relative
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def make_dist(
    site: Path,
    dist: str,
    entry_points: str,
    modules: dict[str, str],
    *,
    version: str = "0.1.0",
    requires: list[str] | None = None,
) -> None:
    """A fake installed distribution: ``<dist>.dist-info`` with a real ``entry_points.txt``
    (written with entry-points-txt) plus its modules, in ``site`` (put it on sys.path)."""
    import entry_points_txt as ept

    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    for r in requires or []:
        meta += f"Requires-Dist: {r}\n"
    (info / "METADATA").write_text(meta)
    # Round-trip through entry-points-txt so the file is exactly what a build would write.
    (info / "entry_points.txt").write_text(ept.dumps(ept.loads(textwrap.dedent(entry_points))))
    for name, source in modules.items():
        path = site / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    """A directory on sys.path (and PYTHONPATH, for subprocesses) for fake distributions."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    yield site
    for name, module in list(sys.modules.items()):  # forget the fake plugins' modules
        if str(getattr(module, "__file__", "") or "").startswith(str(site)):
            del sys.modules[name]


def olmx_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Run the real ``olmx`` command in a subprocess."""
    full_env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([*OLMX, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
