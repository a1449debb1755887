"""The single-field sweep: every field of the run config and of every installed plugin, alone
(its plugin selected), set to each odd value of the plan fuzz (:mod:`tests.plan.test_fuzz`:
zero, negative, huge, NaN/inf, wrong types, unknown choices, odd lists and paths, the edges of
its rule). Each case is planned in a forked process with a time and a memory limit, so a value
that makes the plan loop or grow without bound is caught as such. A case must end as a plan or
as one one-line error of exit code 2; anything else (another exception, a timeout, the memory
limit) is listed with the override that caused it.

    python -m tests.sweep_fields [--out benchmarks/results/field_sweep.md] [--limit-s 30]

Minutes, not collected by pytest: the fuzz test samples the same space in CI; this walks all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

#: Address space one case may take (the plan of a 32B model needs well under 2 GiB).
MEMORY_BYTES = 6 << 30


def cases() -> list[tuple[list[str], str, str]]:
    """``(selection, key, value)``: each field with each of its odd values; ``selection`` picks
    the plugin the field belongs to."""
    from olmx.api import CONFIG_GROUPS
    from tests.plan.test_fuzz import CORE, PLUGINS

    out = [([], key, value) for key, values in CORE for value in values]
    for kind, plugins in PLUGINS.items():
        group = CONFIG_GROUPS[kind]
        for name, fields in sorted(plugins.items()):
            pick = f"{group}={name}" if kind in ("precision", "infra") else f"{group}=[{name}]"
            out += [([pick], key, value) for key, values in fields for value in values]
    return out


def _child(overrides: list[str], runs: Path, limit_s: int, write: int) -> None:
    """Plan ``overrides`` under the limits and write the outcome to the pipe ``write``."""
    from olmx.errors import OlmxError
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    signal.alarm(limit_s)
    try:
        plan_from_overrides([f"trainer.runs_root={runs}", *overrides], registry())
        result = {"outcome": "plan"}
    except OlmxError as exc:
        one = exc.exit_code == 2 and "\n" not in str(exc) and str(exc)
        result = {"outcome": "error" if one else "bad error", "message": str(exc)[:300]}
    except MemoryError:
        result = {"outcome": "memory"}
    except BaseException as exc:  # noqa: BLE001 -- what the sweep is looking for
        result = {"outcome": "exception", "message": f"{type(exc).__name__}: {exc}"[:300]}
    os.write(write, json.dumps(result).encode())
    os._exit(0)


def run_case(overrides: list[str], runs: Path, limit_s: int) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(overrides, runs, limit_s, write)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if data:
        return json.loads(data)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return {"outcome": "timeout"}
    return {"outcome": "died", "message": f"wait status {status}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--limit-s", type=int, default=30, help="seconds one case may take")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="olmx-sweep-"))
    os.environ.setdefault("OLMX_CACHE_DIR", str(root / "cache"))
    os.environ.setdefault("RUNPOD_API_KEY", "sweep-key-not-used")  # the plan never calls RunPod
    os.chdir(root)
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    plan_from_overrides([f"trainer.runs_root={root / 'runs'}"], registry())  # imported once, before the forks
    start, counts, bad = time.monotonic(), Counter(), []
    todo = cases()
    for i, (pick, key, value) in enumerate(todo):
        result = run_case([*pick, f"{key}={value}"], root / "runs", args.limit_s)
        counts[result["outcome"]] += 1
        if result["outcome"] not in ("plan", "error"):
            bad.append((" ".join([*pick, f"{key}={value}"]), result["outcome"], result.get("message", "")))
            print(f"{bad[-1][1]}: {bad[-1][0]}: {bad[-1][2]}", file=sys.stderr, flush=True)
        if i % 200 == 0:
            print(f"{i}/{len(todo)} {dict(counts)}", file=sys.stderr, flush=True)
    minutes = (time.monotonic() - start) / 60
    lines = [
        f"{len(todo):,} single-field cases in {minutes:.1f} min: "
        + ", ".join(f"{n:,} {what}" for what, n in counts.most_common()),
        "",
        "| override | outcome | message |",
        "|---|---|---|",
        *[f"| `{o}` | {what} | {msg.replace('|', '/')} |" for o, what, msg in bad],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
