"""Wall time of olmx's quick commands next to a bare Python start.

Times ``olmx --help``, ``olmx plugins list`` and ``olmx train --dry-run`` (the installed
console script), ``python -c pass`` (the same interpreter) and, as a reference,
``python -c 'import typer, rich.console'`` (the libraries every olmx command starts with),
each ``--repeat`` times, interleaved (every repetition runs all five, in an order rotated per
repetition) because the machine is shared and noisy. Output goes to /dev/null; the working
directory is an empty temporary folder (``--dry-run`` writes nothing). Prints a Markdown
table of median and min per command and their difference over bare Python (goal: under
0.5 s more for ``--help`` and ``plugins list``).

    python benchmarks/cli_startup.py [--repeat 20] [--warmup 2] [--record FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

BIN = Path(sys.executable).parent
GOAL_S = 0.5


def commands() -> dict[str, list[str]]:
    """Label -> command line."""
    olmx = str(BIN / "olmx")
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        # The floor the CLI's libraries set: what every olmx command imports first.
        "python -c 'import typer, rich.console'": [sys.executable, "-c", "import typer, rich.console"],
        "olmx --help": [olmx, "--help"],
        "olmx plugins list": [olmx, "plugins", "list"],
        "olmx train --dry-run": [olmx, "train", "--dry-run"],
    }


def timed(cmd: list[str], cwd: str) -> float:
    """Seconds from start to exit of ``cmd``; exit on failure."""
    start = time.perf_counter()
    rc = subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=cwd)
    elapsed = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {rc}")
    return elapsed


def uptime() -> str:
    """The load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (page cache, .pyc)")
    parser.add_argument("--record", type=Path, default=None, help="append the Markdown result to this file")
    args = parser.parse_args()

    cmds = commands()
    labels = list(cmds)
    times: dict[str, list[float]] = {label: [] for label in labels}
    load_start = uptime()
    with tempfile.TemporaryDirectory(prefix="olmx-cli-bench-") as cwd:
        for i in range(args.warmup + args.repeat):
            order = labels[i % len(labels) :] + labels[: i % len(labels)]
            for label in order:
                t = timed(cmds[label], cwd)
                if i >= args.warmup:
                    times[label].append(t)
    load_end = uptime()

    base_med = statistics.median(times["python -c pass"])
    base_min = min(times["python -c pass"])
    lines = [
        f"### CLI start-up, {datetime.now():%Y-%m-%d %H:%M}",
        "",
        f"{args.repeat} interleaved repetitions after {args.warmup} untimed; os.cpu_count()={os.cpu_count()}; "
        f"load average (1/5/15 min) at start {load_start}, at end {load_end}.",
        "",
        "| command | median s | min s | median − python | min − python | goal |",
        "|---|---|---|---|---|---|",
    ]
    for label in labels:
        med, low = statistics.median(times[label]), min(times[label])
        goal = ""
        if label in ("olmx --help", "olmx plugins list"):
            goal = f"< {GOAL_S} s: {'met' if med - base_med < GOAL_S else 'MISSED'} (median)"
        lines.append(f"| `{label}` | {med:.3f} | {low:.3f} | {med - base_med:+.3f} | {low - base_min:+.3f} | {goal} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
