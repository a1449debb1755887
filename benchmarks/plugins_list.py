"""Start-up cost of ``olmx plugins list`` with extra third-party plugins installed.

Writes ``--plugins`` fake plugin distributions (real ``*.dist-info`` with an
``entry_points.txt`` written by entry-points-txt, spread over the four plugin groups, each with
an ``olmx.conf`` entry too) into a temporary directory on PYTHONPATH, then times, as
alternating subprocesses: bare ``python -c pass``, ``olmx plugins list`` without the fakes and
with them. Every fake module creates a marker file if it is ever imported, so the run also
proves that listing imports no plugin. Prints a markdown table (wall-clock min / median and the
CPU time of the child processes); the target is ``olmx plugins list`` under 0.5 s over bare
Python with 20 extra plugins.

    python benchmarks/plugins_list.py [--plugins 20] [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmx.api import GROUPS  # noqa: E402
from tests.conftest import make_dist  # noqa: E402

MODULE = '''"""Fake plugin {i}: a {kind} plugin that only exists to be listed."""
from pathlib import Path
Path({marker!r}).touch()  # listing must never import this
'''


def fake_site(root: Path, count: int) -> Path:
    """``count`` fake plugin distributions in ``root/site``."""
    site = root / "site"
    kinds = list(GROUPS.items())
    for i in range(count):
        kind, group = kinds[i % len(kinds)]
        module = f"olmx_fake{i}"
        make_dist(
            site,
            f"olmx-fake{i}",
            f"[{group}]\nfake{i} = {module}.plugin:PLUGIN\n[olmx.conf]\nfake{i} = {module}.conf\n",
            {
                f"{module}.__init__": "",
                f"{module}.plugin": MODULE.format(i=i, kind=kind, marker=str(root / f"imported{i}")),
            },
        )
    return site


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + sys of the child) and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", type=int, default=20, help="extra fake plugins to install")
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command")
    args = parser.parse_args()

    olmx = Path(sys.executable).with_name("olmx")
    cmd = [str(olmx)] if olmx.exists() else [sys.executable, "-m", "olmx"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        site = fake_site(root, args.plugins)
        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        base_env["COLUMNS"] = "200"
        with_fakes = {**base_env, "PYTHONPATH": str(site)}
        discover = "from olmx.registry import Registry; [e.description() for e in Registry.discover().entries()]"
        cases = {
            "bare python (`python -c pass`)": ([sys.executable, "-c", "pass"], base_env),
            "`import olmx.cli` (typer, rich)": ([sys.executable, "-c", "import olmx.cli"], base_env),
            "registry discovery + descriptions": ([sys.executable, "-c", discover], base_env),
            f"registry discovery + descriptions, {args.plugins} extra plugins": (
                [sys.executable, "-c", discover],
                with_fakes,
            ),
            "`olmx plugins list`": ([*cmd, "plugins", "list"], base_env),
            f"`olmx plugins list`, {args.plugins} extra plugins": ([*cmd, "plugins", "list"], with_fakes),
            f"`olmx plugins list --json`, {args.plugins} extra plugins": (
                [*cmd, "plugins", "list", "--json"],
                with_fakes,
            ),
        }
        walls: dict[str, list[float]] = {k: [] for k in cases}
        cpus: dict[str, list[float]] = {k: [] for k in cases}
        outputs: dict[str, str] = {}
        for _ in range(args.repeat):  # interleaved, so load changes hit every case alike
            for name, (command, env) in cases.items():
                wall, cpu, out = timed(command, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
                outputs[name] = out
        imported = sorted(p.name for p in root.glob("imported*"))
        listed = sum(
            f"fake{i} " in outputs[f"`olmx plugins list`, {args.plugins} extra plugins"] for i in range(args.plugins)
        )

    bare = "bare python (`python -c pass`)"
    print(
        f"| command ({args.repeat} runs each, interleaved) | wall min (s) | wall median (s) | CPU median (s) "
        "| CPU median over bare python (s) |"
    )
    print("|---|---|---|---|---|")
    for name in cases:
        over = statistics.median(cpus[name]) - statistics.median(cpus[bare])
        print(
            f"| {name} | {min(walls[name]):.3f} | {statistics.median(walls[name]):.3f} "
            f"| {statistics.median(cpus[name]):.3f} | {over:+.3f} |"
        )
    print(f"\nfake plugins listed: {listed}/{args.plugins}; fake plugin modules imported: {len(imported)}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
