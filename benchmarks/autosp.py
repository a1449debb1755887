"""AutoSP-style: the longest sequence that trains at a fixed per-process memory cap, hand-chosen
settings against ``auto``, for 1, 2 and 4 CPU processes (gloo), with the step time at each.

For each process count, a doubling search over ``data.seq_len`` (from ``--start``): at each
length every setting is trained for 4 steps with ``olmx train`` (real processes), its peak is
the largest per-process resident-memory high-water mark (``summary.json``) minus a near-empty
run's (the interpreter, torch, OLMo-core; as ``benchmarks/memory_model.py`` measures), and it
"trains" when the run finishes with that peak under the cap. A run is stopped as soon as one of
its processes passes the cap (``VmHWM``, polled every 0.5 s), so settings that do not fit cost
seconds, not a full run. The step time is the median wall time between consecutive metrics
records of steps 1-4 (rank 0; the first step is left out).

* hand: the best of a small grid, Ulysses degree (none, and every degree dividing the
  processes) x activation checkpointing (none, long_context, full), DDP over the rest: the
  longest length any of them trains at, and the fastest of those at it;
* auto: ``parallel=auto trainer.activation_checkpointing=auto``, planned against the cap (the
  plan's world with ``device_memory_gib`` set to it, which is what ``auto`` reads) at each
  length; its choice's own measurement (the same run where it is one of the hand settings).

Goals (issue #17): auto reaches the hand-chosen best length at no more than 5% more step time;
4 processes reach at least 3.5x the 1-process length. The machine's cores may be shared with
other work: step times are contended, ratios are measured side by side in one run.

    .venv/bin/python benchmarks/autosp.py [--cap-mib 1024] [--procs 1,2,4] [--start 1024] [--max 65536]

Prints the table and writes ``benchmarks/results/autosp.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ulysses import vm_hwm_mib  # noqa: E402
from olmx.rundir import LOCK_ENV, RunDir, processes_with_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
OLMX = [sys.executable, "-m", "olmx"]
COMMON = ["trainer.report=false", "trainer.max_steps=4", "trainer.save_interval=1000", "trainer.warmup_steps=1"]
COMMON += ["eval.interval=null"]
#: A small model whose activations dominate at long sequences: 8 heads, so Ulysses degrees 2, 4, 8 apply.
MODEL = ["model.d_model=256", "model.n_layers=4", "model.hidden_size=1024", "model.n_heads=8"]
BASE = ["model.d_model=32", "model.n_layers=1", "model.hidden_size=64", "model.n_heads=2", "data.seq_len=16"]
BASE += ["infra.nproc_per_node=1", "trainer.global_batch_size=1", "trainer.micro_batch_size=1"]
ACS = ("null", "long_context", "full")
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # freed tensors go back to the OS (memory_model.py)


def _high_water_mib(run_dir: Path) -> float:
    """The largest resident-set high-water mark (``VmHWM``) of the processes that hold ``run_dir``'s
    lock (its launcher's token is in their environment); 0 before the lock exists."""
    holder = RunDir(run_dir).lock_holder()
    peaks = [0.0]
    for pid in processes_with_env(LOCK_ENV, holder.token) if holder is not None else []:
        try:
            peaks.append(vm_hwm_mib(pid))
        except OSError:  # it ended meanwhile
            continue
    return max(peaks)


def train(overrides: list[str], run_dir: Path, stop_above_mib: float | None = None) -> tuple[float, float] | None:
    """(peak MiB of the largest process, median seconds of steps 2-4) of a 4-step run; None if it failed.
    With ``stop_above_mib``, a run whose processes pass it is stopped at once: (the peak seen, nan)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    err_path = run_dir.with_name(run_dir.name + ".stderr")
    cmd = [*OLMX, "train", *COMMON, *overrides, f"trainer.run_dir={run_dir}"]
    with err_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            time.sleep(0.5)
            if stop_above_mib is not None and (seen := _high_water_mib(run_dir)) > stop_above_mib:
                proc.terminate()  # the launcher stops its workers (SIGTERM)
                proc.wait()
                print(f"  stopped over the cap at {seen:,.0f} MiB: {' '.join(overrides[-3:])}", flush=True)
                return seen, float("nan")
    if proc.returncode != 0:
        tail = err_path.read_text().strip().splitlines()[-1:] or ["(no output)"]
        print(f"  failed ({proc.returncode}): {' '.join(overrides[-3:])}: {tail[0][:200]}", flush=True)
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [r["time"] for r in records if "loss" in r and r.get("loss") is not None]
    steps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    step = steps[len(steps) // 2] if steps else float("nan")
    return max(p["peak_mem_mib"] for p in summary["processes"]), step


def hand_grid(n: int) -> list[list[str]]:
    """Ulysses degree x checkpointing for ``n`` processes."""
    layouts: list[list[str]] = [["parallel=[ddp]"] if n > 1 else ["parallel=[]"]]
    layouts += [["parallel=[ddp,ulysses]", f"parallel.ulysses.degree={d}"] for d in (2, 4, 8) if n % d == 0]
    return [[*lay, f"trainer.activation_checkpointing={ac}"] for lay in layouts for ac in ACS]


def auto_choice(overrides: list[str], cap_gib: float) -> list[str] | None:
    """What ``auto`` chooses for ``overrides`` when ``cap_gib`` per process (above the baseline, as the
    memory estimate counts) is available; None where nothing fits."""
    from olmx.config.compose import compose, to_object
    from olmx.plan import auto
    from olmx.plan.resolve import make_evaluator
    from olmx.registry import registry

    reg = registry()
    run = to_object(compose(overrides, reg), reg)
    world = replace(reg.get("infra", run.infra_name).world(run.infra[run.infra_name]), device_memory_gib=cap_gib)
    choice = auto.choose(run, world, reg, make_evaluator(world, reg))
    return None if choice.warning else list(choice.overrides)


def search(n: int, cap: float, base: float, args: argparse.Namespace, tmp: Path) -> tuple[dict, dict]:
    """Doubling lengths until nothing trains under the cap: every hand setting still under it is
    trained at each length, and auto's choice looked up among them (trained too where it is not).
    Returns the hand best and auto's result at their longest lengths."""
    hand: dict = {"length": 0, "setting": "-", "step_s": float("nan")}
    chosen: dict = dict(hand)
    seq = args.start
    alive = hand_grid(n)  # a setting over the cap at one length is over it at every longer one
    while seq <= args.max:
        common = [*MODEL, f"infra.nproc_per_node={n}", f"data.seq_len={seq}", "trainer.micro_batch_size=1"]
        common.append(f"trainer.global_batch_size={n}")
        measured: dict[str, tuple[float, float] | None] = {}
        for i, setting in enumerate(alive):
            measured[" ".join(setting)] = train([*common, *setting], tmp / f"n{n}-s{seq}-{i}", base + cap)
        pick = auto_choice([*common, "parallel=auto", "trainer.activation_checkpointing=auto"], cap / 1024)
        key = " ".join(pick) if pick is not None else None
        if key is not None and key not in measured:
            measured[key] = train([*common, *(pick or [])], tmp / f"n{n}-s{seq}-auto", base + cap)
        fitted = {k: v[1] for k, v in measured.items() if v is not None and v[0] - base <= cap}
        peaks = {k: round(v[0] - base) for k, v in measured.items() if v is not None}
        print(f"  peaks above the baseline (MiB): {peaks}", flush=True)
        print(f"{n} proc(s), {seq:,} tokens: auto {key}; trained under the cap: {fitted}", flush=True)
        if not fitted:
            break
        alive = [setting for setting in alive if " ".join(setting) in fitted]
        best = min(fitted, key=lambda k: fitted[k])
        hand = {"length": seq, "setting": best, "step_s": fitted[best]}
        if key in fitted:
            chosen = {"length": seq, "setting": key, "step_s": fitted[key]}
        seq *= 2
    return hand, chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mib", type=float, default=1024, help="memory cap per process above the baseline")
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--start", type=int, default=1024)
    parser.add_argument("--max", type=int, default=65536)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        baseline = train(BASE, tmp / "baseline")
        assert baseline is not None, "the baseline run failed"
        base = baseline[0]
        rows = []
        for n in (int(x) for x in args.procs.split(",")):
            hand, chosen = search(n, args.cap_mib, base, args, tmp)
            rows.append((n, hand, chosen))
    one = rows[0][2]["length"] or 1
    lines = [
        f"# AutoSP-style: longest trainable sequence at {args.cap_mib:.0f} MiB per process (CPU, gloo)",
        "",
        f"Model {' '.join(MODEL)}; 4 steps per trial; peaks above a {base:.0f} MiB baseline; contended cores.",
        "",
        "| processes | hand best: length | setting | step s | auto: length | setting | step s "
        "| auto/hand step | length vs 1 proc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, hand, chosen in rows:
        ratio = chosen["step_s"] / hand["step_s"] if chosen["length"] == hand["length"] else float("nan")
        lines.append(
            f"| {n} | {hand['length']:,} | `{hand['setting']}` | {hand['step_s']:.2f} | {chosen['length']:,} | "
            f"`{chosen['setting']}` | {chosen['step_s']:.2f} | {ratio:.2f} | {chosen['length'] / one:.1f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "autosp.md").write_text(text)


if __name__ == "__main__":
    main()
