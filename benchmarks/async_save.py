"""Step time during a checkpoint save, synchronous against asynchronous (``trainer.async_save``).

The same run (2 CPU processes under torchrun, DDP, seed 42) is trained twice per round, once
with each kind of save, on a model whose checkpoint takes noticeable time to write (default
d_model 384, 6 layers: 14.6M parameters, a ~170 MB checkpoint of parameters and AdamW's two
moments), with a save every ``--interval`` steps. From rank 0's ``metrics.jsonl`` (the ``time``
of each step's record) it takes the intervals between consecutive steps: the median of those
that hold no save is the plain step time; a save's stall is the time the two intervals after
its step take beyond two plain steps (the save runs after its step; either interval may hold
it, as records arrive when a step's metrics do). Runs alternate (sync first in odd rounds);
the table gives medians over rounds and checks that both runs logged identical losses.

    python benchmarks/async_save.py [--rounds 2] [--steps 20] [--interval 5] [--record FILE]

``--record`` appends the Markdown result to FILE (e.g. benchmarks/results/checkpoint.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["model.d_model=384", "model.n_layers=6", "model.hidden_size=1536"]
COMMON = [
    "trainer.report=false",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.warmup_steps=2",
    "eval.interval=0",
]


def run(run_dir: Path, steps: int, interval: int, async_save: bool, cache: str) -> list[dict]:
    cmd = [sys.executable, "-m", "olmx", "train", *COMMON, *MODEL]
    cmd += [f"trainer.max_steps={steps}", f"trainer.save_interval={interval}", f"trainer.run_dir={run_dir}"]
    cmd += [f"trainer.async_save={'true' if async_save else 'false'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OLMX_CACHE_DIR": cache})
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stats(recs: list[dict], steps: int, interval: int) -> tuple[float, float]:
    """(plain step seconds, mean stall seconds per save) over the saves inside the run."""
    t = {r["step"]: r["time"] for r in recs}
    gaps = {s: t[s] - t[s - 1] for s in range(3, steps + 1)}  # steps 1-2 are warm-up
    saves = [s for s in range(interval, steps - 1, interval)]
    near = {s + k for s in saves for k in (1, 2)}
    plain = statistics.median(g for s, g in gaps.items() if s not in near)
    stalls = [gaps[s + 1] + gaps[s + 2] - 2 * plain for s in saves]
    return plain, statistics.mean(stalls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--record", type=Path, default=None, help="append the Markdown result to this file")
    args = p.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "cache")
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            losses = {}
            for a in order:
                recs = run(Path(tmp) / f"r{r}-{'async' if a else 'sync'}", args.steps, args.interval, a, cache)
                results[a].append(stats(recs, args.steps, args.interval))
                losses[a] = [x["loss"] for x in recs]
            same = same and losses[False] == losses[True]
    rows = []
    for a in (False, True):
        plain = statistics.median(x[0] for x in results[a])
        stall = statistics.median(x[1] for x in results[a])
        rows.append((("async" if a else "sync"), plain, stall, plain + stall))
    sync_stall, async_stall = rows[0][2], rows[1][2]
    lines = [
        f"## Checkpoint saves: step time during a save, sync vs async (`benchmarks/async_save.py`, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"2 CPU processes (DDP, gloo), d_model 384, 6 layers, hidden 1536, 8 x 64 tokens per step, a save "
        f"every {args.interval} of {args.steps} steps; medians over {args.rounds} round(s), both kinds in "
        f"each round. Machine: {os.cpu_count()} cores, {platform.machine()}, load average "
        f"{os.getloadavg()[0]:.1f} at the end (shared).",
        "",
        "| save | plain step (s) | stall per save (s) | step holding a save (s) |",
        "|---|---|---|---|",
        *[f"| {n} | {p:.3f} | {s:.3f} | {h:.3f} |" for n, p, s, h in rows],
        "",
        f"- async stall / sync stall: **{async_stall / sync_stall:.2f}**" if sync_stall > 0 else "- sync stall: 0",
        f"- identical losses, sync and async: **{same}**",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
