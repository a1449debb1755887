"""What held-out evaluation costs the embedded default run (issue #16): ``olmx train`` with its
defaults (tiny model, stdlib corpus, 2 CPU processes) with evaluation on (the default:
``eval.interval=50``, 32 held-out sequences) and off (``eval.interval=0``), run alternately,
side by side on the same machine.

For each run: the wall time of ``olmx train`` (launch to exit), the seconds OLMo-core's
evaluator reports per evaluation (``Finished lm evals in X seconds`` in the rank-0 log), and the
median step time (between consecutive ``metrics.jsonl`` records, evaluated steps excluded). The
machine's cores may be shared with other work: compare the on/off pairs of one run only.

    .venv/bin/python benchmarks/eval_cost.py [--steps 100] [--pairs 2]

Prints the table and writes ``benchmarks/results/eval.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OLMX = [sys.executable, "-m", "olmx"]


def run(steps: int, evaluate: bool, run_dir: Path) -> dict[str, float]:
    """One ``olmx train`` of the default run for ``steps`` steps: wall s, eval s each, step s."""
    overrides = ["trainer.report=false", f"trainer.max_steps={steps}", f"trainer.run_dir={run_dir}"]
    overrides += [] if evaluate else ["eval.interval=0"]
    start = time.perf_counter()
    proc = subprocess.run([*OLMX, "train", *overrides], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"olmx train failed:\n{proc.stderr[-3000:]}")
    log = (run_dir / "logs" / "node0.log").read_text()
    evals = [float(s) for s in re.findall(r"\[default0\].*Finished lm evals in ([\d.]+) seconds", log)]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gaps = [b["time"] - a["time"] for a, b in zip(records, records[1:], strict=False) if "eval/loss" not in b]
    return {
        "wall": wall,
        "evals": len(evals),
        "eval_s": statistics.mean(evals) if evals else 0.0,
        "step_s": statistics.median(gaps),
        "eval_loss": records[-1].get("eval/loss") or float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="olmx-eval-bench-") as tmp:
        for pair in range(args.pairs):
            on = run(args.steps, True, Path(tmp) / f"on{pair}")
            off = run(args.steps, False, Path(tmp) / f"off{pair}")
            rows.append((pair, on, off))
    lines = [
        f"# Held-out evaluation: cost on the default run ({args.steps} steps, 2 CPU processes)",
        "",
        "`.venv/bin/python benchmarks/eval_cost.py "
        f"--steps {args.steps} --pairs {args.pairs}`: the embedded default (`olmx train`), evaluation on "
        "(`eval.interval=50`, 32 held-out sequences of 256 tokens, 2 batches of 8 x 2 ranks) and off, "
        "alternately. Evaluations at steps 50, 100, ... and the last step.",
        "",
        "| pair | wall on (s) | wall off (s) | on / off | evaluations | s per evaluation | step s on | step s off "
        "| last eval/loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, on, off in rows:
        lines.append(
            f"| {pair} | {on['wall']:.1f} | {off['wall']:.1f} | {on['wall'] / off['wall']:.3f} | {on['evals']:.0f} "
            f"| {on['eval_s']:.2f} | {on['step_s']:.3f} | {off['step_s']:.3f} | {on['eval_loss']:.3f} |"
        )
    share = statistics.mean(on["evals"] * on["eval_s"] / on["wall"] for _, on, _ in rows)
    lines += ["", f"Evaluation time over the wall time of the runs with evaluation: {100 * share:.1f}% (mean)."]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "eval.md").write_text(text)


if __name__ == "__main__":
    main()
