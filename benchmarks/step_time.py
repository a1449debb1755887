"""Steady-state step time of ``olmx train`` against the same run written by hand on OLMo-core.

Both sides train the default tiny run (2 CPU processes under torchrun, DDP, seed 42) for
``--steps`` steps with no checkpoint inside the timed window (``save_interval`` above the step
count; the final checkpoint comes after it):

- olmx: ``olmx train trainer.max_steps=N trainer.save_interval=BIG trainer.run_dir=...`` (the
  whole CLI: launcher, progress bar, olmx's own trainer callbacks);
- hand-written: ``benchmarks/handwritten_train.py`` under the same torchrun command line.

Two measurements of the window from step ``--skip`` to the next-to-last step (the first
steps are warm-up; the last step's record races the final checkpoint):

- wall seconds per step, measured the same way on both sides: rank 0's wall clock in the
  ``log_metrics`` callback hook, one record per step (olmx: the ``time`` field of its
  ``metrics.jsonl``; hand-written: ``timing.jsonl``) — the window mean
  ((t_last - t_first) / steps) and the median of the per-step intervals;
- CPU seconds per step of the whole process tree (olmx: CLI launcher + torchrun + workers;
  hand-written: torchrun + workers), read from /proc when the window's first and last
  records appear, split into workers (the tree's leaves) and launchers. On a machine shared
  with other work the wall clock mostly measures the neighbours; CPU time depends on them
  much less (cache and scheduling effects remain), and the launchers' share is what the
  olmx CLI adds outside the training processes.

Both commands start in a new session, as olmx starts its torchrun (torchrun in turn starts
each worker in a session of its own), so that under the kernel's autogroup scheduling, where a
session is scheduled as one group, both sides are treated alike. Runs alternate (olmx first in
odd rounds, hand-written first in even rounds); the table gives medians over rounds, the
ratios olmx / hand-written (goal: within 2%), and checks that both sides logged identical
losses. Also reported: each run's whole wall time and CPU time (start-up included).

    python benchmarks/step_time.py [--rounds 4] [--steps 60] [--skip 10] [--tty] [--record FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SIDES = ("olmx", "handwritten")


def uptime() -> str:
    """The load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def torchrun(nproc: int) -> list[str]:
    """The torchrun prefix ``olmx train`` uses with ``infra=local`` on one node."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--standalone",
    ]


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_of_children() -> float:
    """User + system CPU seconds of all finished (waited-for) descendants so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds (user + system, own and reaped children's) so far of the live process tree
    under ``root``, read from /proc (Linux): (workers, the rest). Workers are the tree's leaves
    (the training processes); the rest are launchers (olmx CLI, torchrun, ``script``)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        f = raw[raw.rfind(")") + 2 :].split()  # f[0] is field 3 (state) of proc(5)
        stats[int(entry.name)] = (int(f[1]), sum(int(x) for x in f[11:15]) / CLK_TCK)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    workers = rest = 0.0
    todo = [root]
    while todo:
        pid = todo.pop()
        cpu = stats.get(pid, (0, 0.0))[1]
        if children.get(pid):
            rest += cpu
            todo += children[pid]
        else:
            workers += cpu
    return workers, rest


def last_step(path: Path) -> int:
    """Step of the last complete record in a metrics/timing jsonl file (0 if none)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    lines = text[: text.rfind("\n") + 1].splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def run(
    cmd: list[str], log: Path, cwd: Path, *, records: Path, marks: tuple[int, int], tty: bool = False
) -> dict[str, float]:
    """Run ``cmd`` in a new session (as olmx starts its torchrun; see the module docstring)
    with output to ``log`` (``tty``: through ``script``, on a pseudo-terminal).
    Returns its wall time, the CPU time of its process tree, and the tree's CPU time per
    step (all, workers, launchers) between the records of the steps in ``marks``
    (snapshots taken when those records appear; polled every 20 ms). Exits on failure."""
    cpu0, start = cpu_of_children(), time.perf_counter()
    snaps: list[tuple[int, tuple[float, float]]] = []
    if tty:
        cmd = ["script", "-q", "-e", "-c", shlex.join(cmd), "/dev/null"]
    env = {**os.environ, "TERM": os.environ.get("TERM", "xterm-256color")} if tty else None
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True, env=env
        )
        while proc.poll() is None:
            if len(snaps) < len(marks):
                step = last_step(records)
                if step >= marks[len(snaps)]:
                    snaps.append((step, tree_cpu(proc.pid)))
            time.sleep(0.02)
    wall, cpu = time.perf_counter() - start, cpu_of_children() - cpu0
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    if len(snaps) < len(marks):
        raise SystemExit(f"{' '.join(cmd)}: the records of steps {marks} never appeared in {records}")
    (s0, (w0, r0)), (s1, (w1, r1)) = snaps
    return {
        "wall": wall,
        "cpu": cpu,
        "cpu_step": (w1 + r1 - w0 - r0) / (s1 - s0),
        "cpu_step_workers": (w1 - w0) / (s1 - s0),
        "cpu_step_launcher": (r1 - r0) / (s1 - s0),
    }


def read_records(path: Path) -> dict[int, dict]:
    """Step -> record of a metrics/timing jsonl file."""
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines()) if r.get("loss") is not None}


def step_stats(records: dict[int, dict], *, skip: int, steps: int) -> tuple[float, float]:
    """(mean, median) seconds per step between the records of steps ``skip`` and ``steps - 1``."""
    window = list(range(skip, steps))
    missing = [s for s in window if s not in records]
    if missing:
        raise SystemExit(f"no record for steps {missing}")
    t = [records[s]["time"] for s in window]
    intervals = [b - a for a, b in itertools.pairwise(t)]
    return (t[-1] - t[0]) / (len(t) - 1), statistics.median(intervals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the window")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument(
        "--tty", action="store_true", help="run both sides on a pseudo-terminal (olmx then draws its progress bar)"
    )
    parser.add_argument("--record", type=Path, default=None, help="append the Markdown result to this file")
    args = parser.parse_args()
    if not 1 <= args.skip < args.steps - 2:
        raise SystemExit("--skip must leave at least two steps in the window")

    sys.path.insert(0, str(HERE))
    from handwritten_train import default_token_file

    data = default_token_file()  # tokenize once, before anything is timed
    save_interval = str(10 * args.steps)
    marks = (args.skip, args.steps - 1)
    load_start = uptime()
    rows: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    losses: dict[str, list[dict[int, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="olmx-step-time-") as tmp:
        tmp_path = Path(tmp)
        for rnd in range(args.rounds):
            for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
                run_dir = tmp_path / f"{side}-{rnd}"
                if side == "olmx":
                    cmd = [
                        str(BIN / "olmx"),
                        "train",
                        f"trainer.max_steps={args.steps}",
                        f"trainer.save_interval={save_interval}",
                        f"trainer.run_dir={run_dir}",
                        f"infra.nproc_per_node={args.nproc}",
                        # the hand-written script neither evaluates nor holds sequences out
                        "eval.interval=0",
                    ]
                    records_file = run_dir / "metrics.jsonl"
                else:
                    cmd = torchrun(args.nproc) + [
                        str(HERE / "handwritten_train.py"),
                        "--run-dir",
                        str(run_dir),
                        "--steps",
                        str(args.steps),
                        "--save-interval",
                        save_interval,
                        "--data",
                        data,
                    ]
                    records_file = run_dir / "timing.jsonl"
                row = run(
                    cmd, tmp_path / f"{side}-{rnd}.log", tmp_path, records=records_file, marks=marks, tty=args.tty
                )
                records = read_records(records_file)
                row["mean"], row["median"] = step_stats(records, skip=args.skip, steps=args.steps)
                rows[side].append(row)
                losses[side].append({s: r["loss"] for s, r in records.items()})
                print(
                    f"round {rnd + 1} {side:11s} wall {row['mean']:.4f} s/step (median interval "
                    f"{row['median']:.4f})  cpu {row['cpu_step']:.4f} s/step (workers {row['cpu_step_workers']:.4f}, "
                    f"launchers {row['cpu_step_launcher']:.4f})  run wall {row['wall']:.1f} s  "
                    f"run cpu {row['cpu']:.1f} s  load {uptime()}",
                    flush=True,
                )
    load_end = uptime()
    print()
    text = report(rows, losses, args=args, load=(load_start, load_end))
    print(text)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n" + text)


def report(
    rows: dict[str, list[dict[str, float]]],
    losses: dict[str, list[dict[int, float]]],
    *,
    args: argparse.Namespace,
    load: tuple[str, str],
) -> str:
    """The Markdown result."""
    keys = ("mean", "median", "cpu_step", "cpu_step_workers", "cpu_step_launcher", "wall", "cpu")
    med = {side: {k: statistics.median(r[k] for r in rows[side]) for k in keys} for side in SIDES}
    ratio = {k: med["olmx"][k] / med["handwritten"][k] for k in keys}
    pairs = {
        k: [o[k] / h[k] for o, h in zip(rows["olmx"], rows["handwritten"], strict=True)] for k in ("mean", "cpu_step")
    }
    loss_diff = max(abs(o[s] - h[s]) for o, h in zip(losses["olmx"], losses["handwritten"], strict=True) for s in o)
    lines = [
        f"### step time, {datetime.now():%Y-%m-%d %H:%M}",
        "",
        f"{args.nproc} CPU processes (DDP, gloo), default tiny run, {args.steps} steps, output to "
        f"{'a pseudo-terminal' if args.tty else 'a file'}, window steps {args.skip}..{args.steps - 1}, "
        f"{args.rounds} interleaved rounds; os.cpu_count()={os.cpu_count()}; "
        f"load average (1/5/15 min) at start {load[0]}, at end {load[1]}. Medians over rounds.",
        "",
        "| | wall s/step (window mean) | wall s/step (median interval) | CPU s/step (process tree) "
        "| CPU s/step workers | CPU s/step launchers | run wall s (incl. start-up) | run CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        m = med[side]
        lines.append(
            f"| {side} | {m['mean']:.4f} | {m['median']:.4f} | {m['cpu_step']:.4f} "
            f"| {m['cpu_step_workers']:.4f} | {m['cpu_step_launcher']:.4f} | {m['wall']:.1f} "
            f"| {m['cpu']:.1f} |"
        )
    lines.append(
        "| olmx / hand-written | "
        + " | ".join(f"**{ratio[k]:.4f}**" if k in ("mean", "cpu_step") else f"{ratio[k]:.4f}" for k in keys)
        + " |"
    )
    lines += [
        "",
        "Per round, olmx / hand-written (same-round pairs): wall s/step "
        + ", ".join(f"{r:.4f}" for r in pairs["mean"])
        + "; CPU s/step "
        + ", ".join(f"{r:.4f}" for r in pairs["cpu_step"])
        + ". Goal: within 2% (ratio <= 1.02).",
        "",
        "Per run wall s/step: "
        + "; ".join(f"{side} " + ", ".join(f"{r['mean']:.4f}" for r in rows[side]) for side in SIDES)
        + ". CPU s/step: "
        + "; ".join(f"{side} " + ", ".join(f"{r['cpu_step']:.4f}" for r in rows[side]) for side in SIDES)
        + ".",
        "",
        f"Largest per-step loss difference olmx vs hand-written, same round: {loss_diff:.3g} "
        "(0: the same computation).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
