"""Soak test of recovery: random SIGKILLs of training ranks and of the ``olmx train`` launcher
over a long CPU run, every one recovered, and the result equal to the same run left alone.
(It was ``benchmarks/soak.py``; that is now the chaos soak: many short runs, six kinds of fault.)

The run is the default tiny run (2 CPU processes, DDP, seed 42) with checkpoints every
``--save-interval`` steps and ``infra.max_restarts`` above the number of kills. A killer loop
waits for each new attempt of the worker group (its ``start`` record in ``events.jsonl``),
lets it train for a random while (or, with probability ``--early``, strikes during its
start-up) and SIGKILLs, with probability ``--launcher``, the ``olmx train`` launcher, else one
of the ranks at random (found as the children of torchrun). Kills therefore land mid-step,
inside checkpoint saves and during start-up.

A rank kill is recovered by torchrun's elastic restart. A launcher kill must end its training
processes (torchrun has the parent-death signal: it passes SIGTERM on, the ranks save a
checkpoint and exit); the loop starts the same ``olmx train`` again at once, which is refused
(exit 2, "in use") while the old processes still run (one writer per run directory), and is
started again until it takes the stale lock over and resumes.

Checked at the end: the last ``olmx train`` exited 0; ``events.jsonl`` holds one
``rank_failed`` per rank kill naming the killed rank and one new attempt per kill; after every
launcher kill its processes were gone and the next launch started only after the killed one's
last record; no lock is left; every step's loss and the final model and optimizer state equal
an uninterrupted run of the same config, bit for bit. Reported per kill: the step reached, the
checkpoint resumed from (steps recomputed), the restart latency (kill to the new attempt's
``start`` record) and, for a launcher kill, how long its processes took to end and how many
relaunches were refused meanwhile.

    python benchmarks/kill_soak.py [--kills 20] [--launcher 0.3] [--steps 600] [--save-interval 10]
                              [--seed 0] [--record benchmarks/results/faults.md]
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
from olmx.rundir import LOCK_ENV, RunDir, processes_with_env  # noqa: E402


def olmx(run_dir: Path, args: list[str], *, env: dict[str, str], n: int = 0) -> subprocess.Popen:
    log = open(run_dir.parent / f"{run_dir.name}{f'-{n}' if n else ''}.out", "w")  # noqa: SIM115
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
    ap.add_argument("--launcher", type=float, default=0.3, help="probability that a kill hits the launcher")
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
    train_args = [*common, f"infra.max_restarts={args.kills + 5}"]
    launches = 1
    proc = olmx(run, train_args, env=env, n=launches)
    kills: list[dict] = []
    refused_total = 0
    seen = 0  # start records seen
    while len(kills) < args.kills:
        while len(starts(run)) <= seen and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
        begin = starts(run)[seen]
        seen = len(starts(run))
        early = rng.random() < args.early
        if not early:  # let the attempt train: a step past its resume point, then a random while
            base = begin.get("resumed_from") or 0
            while proc.poll() is None and not any(r["step"] > base for r in records(run)[-3:]):
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 6.0))
        if proc.poll() is not None:
            break
        recs = records(run)
        kill = {
            "start": begin,
            "time": time.time(),
            "early": early,
            "step": recs[-1]["step"] if recs else 0,
        }
        if rng.random() < args.launcher:
            holder = RunDir(run).lock_holder()
            proc.kill()
            proc.wait()
            kill.update(kind="launcher", rank=None, launch=begin.get("launch"))
            # Start it again at once: refused while the killed launch's processes still run.
            refused, gone_s = 0, None
            while True:
                launches += 1
                proc = olmx(run, train_args, env=env, n=launches)
                while proc.poll() is None:
                    now = RunDir(run).lock_holder()
                    if now is not None and now.pid == proc.pid:
                        break  # it took the lock over
                    if gone_s is None and holder and not processes_with_env(LOCK_ENV, holder.token):
                        gone_s = round(time.time() - kill["time"], 1)
                    time.sleep(0.1)
                if proc.poll() is None or proc.returncode != 2:
                    break  # running (or ended otherwise: the loop above sees that)
                refused += 1
                time.sleep(0.5)
            if gone_s is None and holder:
                while processes_with_env(LOCK_ENV, holder.token):
                    time.sleep(0.2)
                gone_s = round(time.time() - kill["time"], 1)
            kill.update(gone_s=gone_s, refused=refused)
            refused_total += refused
        else:
            tr = torchrun_pid(proc.pid)
            ranks = workers(tr) if tr else {}
            if not ranks:
                time.sleep(0.2)
                seen -= 1  # try this attempt again
                continue
            rank = rng.choice(sorted(ranks))
            os.kill(ranks[rank], signal.SIGKILL)
            kill.update(kind="rank", rank=rank, gone_s=None, refused=None)
        kills.append(kill)
        what = "launcher" if kill["kind"] == "launcher" else f"rank {kill['rank']}"
        extra = f", its processes gone after {kill['gone_s']} s, {kill['refused']} relaunch(es) refused meanwhile"
        print(
            f"kill {len(kills)}: {what} at step ~{kill['step']}{' (start-up)' if early else ''}"
            f"{extra if kill['kind'] == 'launcher' else ''}",
            flush=True,
        )
    rc = proc.wait()
    wall = time.time() - t0

    events = read_events(run)
    failed = [e for e in events if e["event"] == "rank_failed"]
    st = starts(run)
    ends = [e for e in events if e["event"] == "end"]
    overlaps = 0
    for k in kills:
        i = next(j for j, s in enumerate(st) if s is k["start"] or s == k["start"])
        nxt = st[i + 1] if i + 1 < len(st) else None
        k["resumed_from"] = nxt.get("resumed_from") if nxt else None
        k["latency_s"] = round(nxt["time"] - k["time"], 1) if nxt else None
        k["recomputed"] = max(0, k["step"] - (k["resumed_from"] or 0)) if nxt else None
        if k["kind"] == "rank":
            match = [
                f
                for f in failed
                if f.get("launch") == k["start"].get("launch") and f["attempt"] == k["start"]["attempt"]
            ]
            k["reported"] = match[0]["cause"] if match else "-"
            k["reported_rank"] = match[0]["local_rank"] if match else None
        else:
            mine = [e for e in ends if e.get("launch") == k["launch"]]
            k["reported"] = f"end: {mine[-1]['reason']} at step {mine[-1]['step']}" if mine else "no end record"
            k["reported_rank"] = None
            # one writer: the next launch started after the killed launch's last record
            last = max((e["time"] for e in events if e.get("launch") == k["launch"]), default=0)
            if nxt is not None and nxt["time"] < last:
                overlaps += 1
    same_loss = {r["step"]: r["loss"] for r in records(run)} == {r["step"]: r["loss"] for r in records(ref)}
    final = run / "checkpoints" / f"step{args.steps}"
    import torch

    a, b = state(final), state(ref / "checkpoints" / f"step{args.steps}")
    same_state = a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )
    recovered = sum(1 for k in kills if k["latency_s"] is not None)  # a new attempt started and trained on
    rank_kills = [k for k in kills if k["kind"] == "rank"]
    launcher_kills = [k for k in kills if k["kind"] == "launcher"]
    lock_left = RunDir(run).lock_file.exists()
    ok = (
        rc == 0
        and len(kills) == args.kills
        and recovered == args.kills
        and same_loss
        and same_state
        and all(k["reported_rank"] == k["rank"] for k in rank_kills)
        and all(k["reported"].startswith("end: ") for k in launcher_kills)
        and overlaps == 0
        and not lock_left
    )
    gone = sorted(k["gone_s"] for k in launcher_kills if k["gone_s"] is not None)
    latencies = sorted(k["latency_s"] for k in kills if k["latency_s"] is not None)

    lines = [
        "# Fault tolerance: soak benchmark (`benchmarks/kill_soak.py`)",
        "",
        f"Default tiny run (2 CPU processes, DDP), {args.steps} steps, a checkpoint every {args.save_interval} "
        f"steps, `infra.max_restarts={args.kills + 5}`; {args.kills} SIGKILLs at random times (seed {args.seed}): "
        f"{len(rank_kills)} of a random rank, {len(launcher_kills)} of the `olmx train` launcher (then started "
        f"again at once); {sum(k['early'] for k in kills)} during start-up. Machine: {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end (shared).",
        "",
        f"- last `olmx train` exit code: **{rc}**; kills: **{len(kills)}**, recovered: **{recovered}**; "
        f"killed rank named correctly in `events.jsonl`: **{sum(k['reported_rank'] == k['rank'] for k in rank_kills)}"
        f"/{len(rank_kills)}**",
        f"- launcher kills whose processes then ended with a checkpoint and a final record (`end: SIGTERM`, "
        f"or `max_steps` when the kill came after the last step): "
        f"**{sum(k['reported'].startswith('end: ') for k in launcher_kills)}/{len(launcher_kills)}**, "
        f"processes gone after {gone[0] if gone else '-'}-{gone[-1] if gone else '-'} s (median "
        f"{gone[len(gone) // 2] if gone else '-'} s); relaunches refused while they ran: **{refused_total}**; "
        f"launches that started before the killed one's last record: **{overlaps}**; lock left at the end: "
        f"**{lock_left}**",
        f"- every step's loss equal to the uninterrupted run: **{same_loss}**; final model and optimizer "
        f"state bitwise equal: **{same_state}**",
        f"- wall time: {wall:.0f} s with kills, {ref_wall:.0f} s uninterrupted; restart latency median "
        f"{latencies[len(latencies) // 2] if latencies else '-'} s; "
        f"steps recomputed in total: {sum(k['recomputed'] or 0 for k in kills)}",
        "",
        "| # | killed | step reached | resumed from | recomputed | restart latency (s) | processes gone (s) "
        "| relaunches refused | reported |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(kills, 1):
        who = "launcher" if k["kind"] == "launcher" else f"rank {k['rank']}"
        reported = k["reported"] + (f" (rank {k['reported_rank']})" if k["kind"] == "rank" else "")
        lines.append(
            f"| {i} | {who}{' (start-up)' if k['early'] else ''} | {k['step']} | "
            f"{k['resumed_from'] if k['resumed_from'] is not None else 'scratch'} | {k['recomputed']} | "
            f"{k['latency_s']} | {k['gone_s'] if k['gone_s'] is not None else '-'} | "
            f"{k['refused'] if k['refused'] is not None else '-'} | {reported} |"
        )
    lines += ["", f"Result: **{'PASS' if ok else 'FAIL'}** (run folder: {root})", ""]
    text = "\n".join(lines)
    print(text)
    if args.record:  # replace the soak section, keep what follows it (## sections)
        rest = ""
        if args.record.exists():
            old = args.record.read_text()
            rest = old[old.index("\n## ") :] if "\n## " in old else ""
        args.record.write_text(text.rstrip("\n") + "\n" + rest)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
