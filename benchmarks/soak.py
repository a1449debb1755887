"""Soak test of recovery: random SIGKILLs of training ranks over a long CPU run, every one
recovered by torchrun's elastic restarts, and the result equal to the same run left alone.

The run is the default tiny run (2 CPU processes, DDP, seed 42) with checkpoints every
``--save-interval`` steps and ``infra.max_restarts`` above the number of kills. A killer loop
waits for each new attempt of the worker group (its ``start`` record in ``events.jsonl``),
lets it train for a random while (or, with probability ``--early``, strikes during its
start-up) and SIGKILLs one of its ranks at random, found as the children of torchrun. Kills
therefore land mid-step, inside checkpoint saves and during start-up.

Checked at the end: ``olmx train`` exited 0; ``events.jsonl`` holds one ``rank_failed`` per
kill naming the killed rank and one restart per kill; every step's loss and the final model
and optimizer state equal an uninterrupted run of the same config, bit for bit. Reported per
kill: the step reached, the checkpoint resumed from (steps recomputed) and the restart
latency (kill to the new attempt's ``start`` record).

    python benchmarks/soak.py [--kills 20] [--steps 600] [--save-interval 10] [--seed 0]
                              [--record benchmarks/results/faults.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=256",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.warmup_steps=2",
    "trainer.lr=3e-3",
]
sys.path.insert(0, str(REPO))

from olmx.events import read_events  # noqa: E402


def olmx(run_dir: Path, args: list[str], *, env: dict[str, str]) -> subprocess.Popen:
    log = open(run_dir.parent / f"{run_dir.name}.out", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "olmx", "train", *SMALL, f"trainer.run_dir={run_dir}", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def workers(parent: int) -> dict[int, int]:
    """rank -> pid of the worker processes whose parent is ``parent`` (torchrun)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for item in env:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = int(stat.parent.name)
    return out


def torchrun_pid(launcher: int) -> int | None:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == launcher and b"torch.distributed.run" in cmd:
            return int(stat.parent.name)
    return None


def starts(run_dir: Path) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == "start"]


def state(ckpt: Path) -> dict:
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

    d = str(ckpt / "model_and_optim")
    keys = sorted(get_checkpoint_metadata(d).state_dict_metadata)
    return dict(zip(keys, load_keys(d, keys), strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--save-interval", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--early", type=float, default=0.15, help="probability of a kill during start-up")
    ap.add_argument("--record", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="olmx-soak-"))
    env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "OLMX_CACHE_DIR": str(root / "cache")}
    common = [f"trainer.max_steps={args.steps}", f"trainer.save_interval={args.save_interval}"]

    t0 = time.time()
    ref = root / "ref"
    if olmx(ref, common, env=env).wait() != 0:
        print(f"reference run failed: {root / 'ref.out'}")
        return 1
    ref_wall = time.time() - t0

    run = root / "soak"
    t0 = time.time()
    proc = olmx(run, [*common, f"infra.max_restarts={args.kills + 5}"], env=env)
    kills: list[dict] = []
    while len(kills) < args.kills and proc.poll() is None:
        attempt = len(kills)
        while len(starts(run)) <= attempt and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
        begin = starts(run)[attempt]
        early = rng.random() < args.early
        if not early:  # let the attempt train: a step past its resume point, then a random while
            base = begin.get("resumed_from") or 0
            while proc.poll() is None and not any(r["step"] > base for r in records(run)[-3:]):
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 6.0))
        tr = torchrun_pid(proc.pid)
        ranks = workers(tr) if tr else {}
        if not ranks:
            time.sleep(0.2)
            continue
        rank = rng.choice(sorted(ranks))
        recs = records(run)
        os.kill(ranks[rank], signal.SIGKILL)
        kills.append(
            {
                "attempt": attempt,
                "rank": rank,
                "time": time.time(),
                "early": early,
                "step": recs[-1]["step"] if recs else 0,
            }
        )
        print(
            f"kill {len(kills)}: rank {rank} at step ~{kills[-1]['step']}{' (start-up)' if early else ''}", flush=True
        )
    rc = proc.wait()
    wall = time.time() - t0

    events = read_events(run)
    failed = [e for e in events if e["event"] == "rank_failed"]
    st = starts(run)
    for k in kills:
        nxt = st[k["attempt"] + 1] if k["attempt"] + 1 < len(st) else None
        k["resumed_from"] = nxt.get("resumed_from") if nxt else None
        k["latency_s"] = round(nxt["time"] - k["time"], 1) if nxt else None
        k["recomputed"] = (k["step"] - (k["resumed_from"] or 0)) if nxt else None
        match = [f for f in failed if f["attempt"] == k["attempt"]]
        k["reported"] = match[0]["cause"] if match else "-"
        k["reported_rank"] = match[0]["local_rank"] if match else None
    same_loss = {r["step"]: r["loss"] for r in records(run)} == {r["step"]: r["loss"] for r in records(ref)}
    final = run / "checkpoints" / f"step{args.steps}"
    import torch

    a, b = state(final), state(ref / "checkpoints" / f"step{args.steps}")
    same_state = a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )
    recovered = sum(1 for k in kills if k["latency_s"] is not None)  # a new attempt started and trained on
    ok = (
        rc == 0
        and len(kills) == args.kills
        and recovered == args.kills
        and same_loss
        and same_state
        and all(k["reported_rank"] == k["rank"] for k in kills)
    )

    lines = [
        "# Fault tolerance: soak benchmark (`benchmarks/soak.py`)",
        "",
        f"Default tiny run (2 CPU processes, DDP), {args.steps} steps, a checkpoint every {args.save_interval} "
        f"steps, `infra.max_restarts={args.kills + 5}`; {args.kills} SIGKILLs of a random rank at random "
        f"times (seed {args.seed}; {sum(k['early'] for k in kills)} during start-up). Machine: "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end (shared).",
        "",
        f"- `olmx train` exit code: **{rc}**; kills: **{len(kills)}**, recovered: **{recovered}**; "
        f"rank named correctly in `events.jsonl`: **{sum(k['reported_rank'] == k['rank'] for k in kills)}"
        f"/{len(kills)}**",
        f"- every step's loss equal to the uninterrupted run: **{same_loss}**; final model and optimizer "
        f"state bitwise equal: **{same_state}**",
        f"- wall time: {wall:.0f} s with kills, {ref_wall:.0f} s uninterrupted; restart latency median "
        f"{sorted(k['latency_s'] for k in kills if k['latency_s'] is not None)[len(kills) // 2] if kills else '-'} s; "
        f"steps recomputed in total: {sum(k['recomputed'] or 0 for k in kills)}",
        "",
        "| # | killed rank | step reached | resumed from | recomputed | restart latency (s) | reported cause |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(kills, 1):
        lines.append(
            f"| {i} | {k['rank']}{' (start-up)' if k['early'] else ''} | {k['step']} | "
            f"{k['resumed_from'] if k['resumed_from'] is not None else 'scratch'} | {k['recomputed']} | "
            f"{k['latency_s']} | {k['reported']} (rank {k['reported_rank']}) |"
        )
    lines += ["", f"Result: **{'PASS' if ok else 'FAIL'}** (run folder: {root})", ""]
    text = "\n".join(lines)
    print(text)
    if args.record:
        args.record.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
