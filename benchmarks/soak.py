"""Chaos soak: many short real ``olmx train`` runs, each driven into one fault at a random
instant, resumed to the end and compared with a fault-free twin.

First a fault-free twin is trained (the tests' SMALL run: a 2-layer d_model 64 model, 2 gloo
processes, ``--steps`` steps, a checkpoint every ``--save-interval``). Then every round starts a
fresh run directory, picks a fault kind (the kinds in a shuffled cycle, so that every kind comes
``rounds / 6`` times) and an instant at random, drives a real ``olmx train`` (a subprocess) into
it, and runs the same ``olmx train`` again until the run completes:

- ``kill``: ``OLMX_FAULTS=kill@S:R`` (SIGKILL of rank R after its backward pass of step S) with
  ``infra.max_restarts=1``: torchrun restarts the group, olmx train exits 0; a ``rank_failed``
  event names local rank R and SIGKILL (on Slurm none is recorded yet:
  ``benchmarks/results/soak.md``, finding 4). In the other kinds no ``rank_failed`` may blame a
  rank (but a hang's culprit).
- ``launcher-kill``: SIGKILL of the ``olmx train`` process itself at a random instant (after a
  random step, plus a random fraction of a second). Locally torchrun gets SIGTERM (parent-death
  signal) and the ranks save the step they are in: an ``end`` record ``SIGTERM`` names it. The
  soak starts the same ``olmx train`` again at once; it is refused (exit 2, in use) while the
  killed launch's processes still run, and started again until it resumes. On Slurm the job
  outlives the command that follows it: the relaunch waits for it the same way.
- ``stop``: ``stop@S:R`` (SIGSTOP of rank R; S >= 2: the hang watchdog is armed after an
  attempt's first step) with ``trainer.hang_timeout=10`` and ``infra.max_restarts`` 0 or 1 at
  random: a ``hang`` event names rank R at step S; exit 0 (restarted), or 77 and then the soak
  resumes it.
- ``nan``: ``nan@S:R`` (rank R's forward passes of step S are NaN). A skipped step changes the
  run, so "exact" means against a twin with the same skip: the round trains that skip twin
  (``trainer.on_nonfinite=skip``, uninterrupted; its losses before S must equal the fault-free
  twin's), then the same fault with ``trainer.on_nonfinite=stop`` (exit 76, an ``end`` record
  ``nonfinite`` at S, the checkpoint of S holding the state from before it) and a resume, whose
  every loss must equal the skip twin's. Both ``nonfinite`` events must name ranks [R], verdict
  ``this rank``.
- ``term``: SIGTERM to the launcher at a random instant (locally ``olmx train``; on Slurm
  ``scancel --batch --signal=TERM``, as before the time limit), or ``term@S:R`` (SIGTERM to one
  rank, step S): exit 75 and an ``end`` record ``SIGTERM``, then the soak resumes it.
- ``nospace``: ``nospace@S:R`` at a checkpoint step S (rank R's first write of that save raises
  ENOSPC): exit 75, an ``end`` record ``nospace`` (``failed_step`` S, ``step`` the intact one),
  no partial checkpoint left; then the soak resumes it.

Checked after every round: (a) every loss in ``metrics.jsonl`` (the steps done again after a
resume included) equals the twin's for that step, as JSON floats (bit for bit), and the final
model and optimizer state equal the twin's final checkpoint, bit for bit; (b) the failure was
named right (the event above, with the rank and step) and every launch's exit code is the
documented one; (c) nothing lost: every published checkpoint (``.metadata.json``) verifies
against its manifest (olmx.worker.checkpoint.verify), none is left partial, the final step's
exists, and the resume started from the checkpoint the fault should have left (the newest
before the fault, or the one the stop saved); (d) goodput (``summary.json``'s ``goodput``) against
the twin's, and the recovery time: from the fault (its marker file in ``RUN_DIR/work/faults``,
or the moment the soak signalled) to the first step of the attempt that resumed. The round's
instant is the step the fault fired at (S, or the last step recorded before a signal, plus the
delay).

    python benchmarks/soak.py [--rounds 12] [--seed S] [--infra local|slurm] [--record]
                              [--steps 16] [--save-interval 4] [--kinds kill,nan] [--src DIR]

``--seed`` (printed) replays the choices (the instants of signals also depend on timing).
``--record`` appends the table to ``benchmarks/results/soak.md`` and rebuilds
``benchmarks/RESULTS.md``. ``--src`` runs the olmx of another checkout of this repository
(for example ``git worktree add --detach /tmp/olmx-src HEAD``, so that uncommitted edits in
this one stay out); its commit is recorded, and where olmx, its conf and its plugins were
imported from (this venv's editable install maps ``olmx.conf``, ``olmx.templates`` and
``olmx_plugins`` to this checkout unless the other links ``olmx/conf``, ``olmx/templates`` and
``olmx_plugins`` to its own). The previous soak (many kills of one long run) is
``benchmarks/kill_soak.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The tests' SMALL run (tests/test_training.py).
SMALL = [
    "trainer.report=false",
    "model.d_model=64",
    "model.n_layers=2",
    "model.hidden_size=256",
    "data.seq_len=64",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.warmup_steps=2",
    "trainer.lr=3e-3",
]
#: The tests' Slurm settings (tests/plugins/infra/slurm/test_slurm_train.py).
SLURM = ["infra=slurm", "infra.poll_seconds=0.5", "infra.time=10"]
#: The folders whose uncommitted changes would change what a soak measures.
CODE = ("olmx", "plugins", "conf", "templates")
KINDS = ("kill", "launcher-kill", "stop", "nan", "term", "nospace")
#: trainer.hang_timeout of the ``stop`` rounds (as tests/worker/test_hang.py).
HANG_TIMEOUT = 10
#: Seconds a launch may take before the soak gives up on it (and ends its processes).
LAUNCH_TIMEOUT = 600
TAG_ENV = "OLMX_SOAK_TAG"
EXIT_IN_USE = 2


@dataclass
class Launch:
    """One ``olmx train`` of a round."""

    n: int
    args: list[str]
    faults: str
    proc: subprocess.Popen
    started: float
    out: Path
    err: Path
    rc: int | None = None
    ended: float | None = None

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> int:
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
            with open(self.err, "a") as f:
                f.write(f"\nsoak: killed after {timeout} s\n")
        self.ended = time.time()
        return self.rc

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""


@dataclass
class Round:
    """What one round did and found."""

    i: int
    kind: str
    run: Path
    detail: str = ""
    instant: str = ""
    #: The step a fault of OLMX_FAULTS fired at.
    step: int | None = None
    launches: list[Launch] = field(default_factory=list)
    fault_time: float | None = None
    expected_resume: int | None = None
    resumed_from: int | None = None
    named: bool = False
    named_why: str = ""
    codes_ok: bool = False
    exact: bool = False
    exact_why: str = ""
    kept: bool = False
    kept_why: str = ""
    goodput: float | None = None
    wall_s: float | None = None
    lost_s: float | None = None
    recovery_s: float | None = None
    missed: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.named and self.codes_ok and self.exact and self.kept and not self.problems


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.src = Path(args.src).resolve() if args.src else REPO
        self.root = Path(tempfile.mkdtemp(prefix="olmx-chaos-"))
        self.rng = random.Random(args.seed)
        self.steps, self.interval = args.steps, args.save_interval
        self.saves = [s for s in range(self.interval, self.steps + 1, self.interval)]
        self.infra = SLURM if args.infra == "slurm" else []
        path = os.environ.get("PYTHONPATH")
        self.env = {
            **os.environ,
            "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1",
            "OLMX_CACHE_DIR": str(self.root / "cache"),
            "PYTHONPATH": str(self.src) + (os.pathsep + path if path else ""),
            "COLUMNS": "200",
        }
        self.twin_losses: dict[int, float | None] = {}
        self.twin_goodput: dict[str, Any] = {}
        self.skip_twins: dict[tuple[int, int], Path] = {}
        self._states: dict[Path, dict[str, Any]] = {}

    # -- launching ------------------------------------------------------------------------------

    def start(self, run: Path, extra: list[str], *, faults: str = "", n: int = 0) -> Launch:
        args = [*SMALL, f"trainer.run_dir={run}", f"trainer.max_steps={self.steps}"]
        args += [f"trainer.save_interval={self.interval}", *self.infra, *extra]
        out, err = run.parent / f"{run.name}.{n}.out", run.parent / f"{run.name}.{n}.err"
        env = {**self.env, "OLMX_FAULTS": faults, TAG_ENV: run.name}
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "olmx", "train", *args],
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                env=env,
                cwd=self.src,
            )
        return Launch(n, args, faults, proc, time.time(), out, err)

    def run_once(self, r: Round, extra: list[str], faults: str = "") -> Launch:
        launch = self.start(r.run, extra, faults=faults, n=len(r.launches))
        r.launches.append(launch)
        launch.wait()
        return launch

    def resume(self, r: Round, extra: list[str], tries: int = 3) -> Launch:
        """The same olmx train again until it is not refused as in use (the processes of a
        killed launch, or its Slurm job, still run) and until it completes or fails."""
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        launch = self.run_once(r, extra)
        while launch.rc == EXIT_IN_USE and "in use" in launch.stderr() and time.monotonic() < deadline:
            time.sleep(0.5)
            r.launches.pop()  # refused: nothing of it counts (it wrote nothing)
            r.detail += "" if "refused" in r.detail else ", relaunch refused while in use"
            launch = self.run_once(r, extra)
        for _ in range(tries - 1):  # a launch that ended early (75) is resumed again
            if launch.rc != 75:
                break
            launch = self.run_once(r, extra)
        return launch

    def reap(self, r: Round) -> None:
        """End whatever of the round still runs (only processes carrying the round's tag)."""
        from olmx.rundir import processes_with_env

        deadline = time.monotonic() + 60
        while (left := processes_with_env(TAG_ENV, r.run.name)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            r.problems.append(f"process {pid} of the round still ran 60 s after it; killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.infra:
            jid = job_id(r.run)
            if jid:
                from olmx_plugins.infra.slurm import jobs

                if jobs.job_state(jid) not in jobs.TERMINAL_STATES:
                    r.problems.append(f"Slurm job {jid} still ran after the round; cancelled")
                    jobs.cancel(jid)

    def wait_for_step(self, run: Path, launch: Launch, step: int) -> int | None:
        """Wait until ``metrics.jsonl`` reaches ``step`` while the launch runs; the last step."""
        while launch.proc.poll() is None:
            recs = records(run)
            if recs and recs[-1]["step"] >= step:
                return int(recs[-1]["step"])
            time.sleep(0.02)
        return None

    # -- the twin -------------------------------------------------------------------------------

    def twin(self) -> int:
        r = Round(0, "twin", self.root / "twin")
        t0 = time.time()
        launch = self.run_once(r, [])
        if launch.rc != 0:
            print(f"the fault-free twin failed (exit {launch.rc}): {launch.err}\n{launch.stderr()[-3000:]}")
            return 1
        self.twin_losses = losses(r.run)
        self.twin_goodput = goodput(r.run) or {}
        print(
            f"twin: {len(self.twin_losses)} steps in {time.time() - t0:.1f} s, goodput "
            f"{fmt(self.twin_goodput.get('goodput'), '.4f')} of {fmt(self.twin_goodput.get('wall_s'), '.1f')} s "
            f"({r.run})",
            flush=True,
        )
        return 0

    def skip_twin(self, step: int, rank: int, r: Round) -> Path | None:
        """The uninterrupted run that skips step ``step`` (NaN on ``rank``), trained once."""
        key = (step, rank)
        if key not in self.skip_twins:
            run = self.root / f"skiptwin-s{step}r{rank}"
            t = Round(0, "skip twin", run)
            launch = self.run_once(t, ["trainer.on_nonfinite=skip"], faults=f"nan@{step}:{rank}")
            if launch.rc != 0:
                r.problems.append(f"the skip twin exited {launch.rc} ({launch.err})")
                return None
            [bad] = events(run, "nonfinite") or [{}]
            if not named_nonfinite(bad, step, rank, "skip"):
                r.problems.append(f"the skip twin's nonfinite event does not name rank {rank} at {step}: {bad}")
            self.skip_twins[key] = run
        return self.skip_twins[key]

    # -- rounds ---------------------------------------------------------------------------------

    def prev_save(self, step: int) -> int | None:
        """The newest checkpoint before ``step`` (a sync save of step N ends before N+1 starts)."""
        done = [s for s in self.saves if s < step]
        return done[-1] if done else None

    def marker_time(self, run: Path, kind: str, step: int, rank: int) -> float | None:
        marker = run / "work" / "faults" / f"{kind}@{step}.rank{rank}"
        return marker.stat().st_mtime if marker.exists() else None

    def round(self, i: int, kind: str) -> Round:
        r = Round(i, kind, self.root / f"r{i:02d}-{kind}")
        rng, steps = self.rng, self.steps
        rank = rng.randrange(2)
        reference = None  # the run whose losses and final state this round must reproduce
        try:
            if kind == "kill":
                s = rng.randint(1, steps)
                r.instant, r.detail = f"step {s}", f"SIGKILL rank {rank}, infra.max_restarts=1"
                first = self.run_once(r, ["infra.max_restarts=1"], faults=f"kill@{s}:{rank}")
                r.codes_ok = first.rc == 0
                r.fault_time = self.marker_time(r.run, "kill", s, rank)
                r.expected_resume = self.prev_save(s)
                failed = events(r.run, "rank_failed")
                r.named = len(failed) == 1 and failed[0].get("local_rank") == rank and "SIGKILL" in failed[0]["cause"]
                r.named_why = "; ".join(f"rank {f.get('local_rank')}: {f.get('cause')}" for f in failed) or "none"
            elif kind == "stop":
                s = rng.randint(2, steps)
                restarts = rng.randrange(2)
                r.instant, r.detail = f"step {s}", f"SIGSTOP rank {rank}, infra.max_restarts={restarts}"
                extra = [f"trainer.hang_timeout={HANG_TIMEOUT}", f"infra.max_restarts={restarts}"]
                first = self.run_once(r, extra, faults=f"stop@{s}:{rank}")
                r.codes_ok = first.rc == (0 if restarts else 77)
                if first.rc != 0:  # (whatever the code: the run must still resume to the end)
                    r.codes_ok &= "hang at step" in first.stderr()
                    self.resume(r, extra)
                r.fault_time = self.marker_time(r.run, "stop", s, rank)
                r.expected_resume = self.prev_save(s)
                hangs = events(r.run, "hang")
                r.named = len(hangs) == 1 and hangs[0].get("ranks") == [rank] and hangs[0].get("step") == s
                r.named_why = "; ".join(f"ranks {h.get('ranks')} at step {h.get('step')}" for h in hangs) or "none"
            elif kind == "nan":
                s = r.step = rng.randint(1, steps)
                r.instant, r.detail = f"step {s}", f"NaN on rank {rank}, stop then resume vs a skip twin"
                reference = self.skip_twin(s, rank, r)
                first = self.run_once(r, ["trainer.on_nonfinite=stop"], faults=f"nan@{s}:{rank}")
                r.codes_ok = first.rc == 76
                if first.rc != 0:
                    self.resume(r, [])
                r.fault_time = self.marker_time(r.run, "nan", s, rank)
                r.expected_resume = s
                bad = events(r.run, "nonfinite")
                ends = [e for e in events(r.run, "end") if e.get("reason") == "nonfinite"]
                r.named = (
                    len(bad) == 1 and named_nonfinite(bad[0], s, rank, "stop") and [e.get("step") for e in ends] == [s]
                )
                r.named_why = (
                    "; ".join(f"ranks {b.get('ranks')} at {b.get('step')}, {b.get('verdict')}" for b in bad) or "none"
                )
            elif kind in ("launcher-kill", "term"):
                variant = "launcher" if kind == "launcher-kill" or rng.random() < 0.5 else "rank"
                if variant == "rank":
                    s = rng.randint(1, steps)
                    r.instant, r.detail = f"step {s}", f"SIGTERM to rank {rank}"
                    first = self.run_once(r, [], faults=f"term@{s}:{rank}")
                    r.fault_time = self.marker_time(r.run, "term", s, rank)
                    r.expected_resume = s
                else:
                    after = rng.randint(1, steps - 2)
                    delay = rng.uniform(0.0, 0.3)
                    first = self.start(r.run, [], n=0)
                    r.launches.append(first)
                    reached = self.wait_for_step(r.run, first, after)
                    time.sleep(delay)
                    r.fault_time = time.time()
                    last = records(r.run)
                    at = last[-1]["step"] if last else 0
                    r.instant = f"after step {after} +{delay:.2f} s (step {at} recorded)"
                    if reached is None or first.proc.poll() is not None:
                        r.missed = True  # the run ended before the fault
                    elif kind == "launcher-kill":
                        r.detail = "SIGKILL of olmx train" + (" (the follower; the job runs on)" if self.infra else "")
                        first.proc.kill()
                    elif self.infra:
                        r.detail = "scancel --batch --signal=TERM (the job's pre-emption notice)"
                        subprocess.run(["scancel", "--batch", "--signal=TERM", job_id(r.run) or "?"], check=False)
                    else:
                        r.detail = "SIGTERM to olmx train"
                        first.proc.send_signal(signal.SIGTERM)
                    first.wait()
                if r.missed:
                    r.codes_ok = first.rc == 0
                    r.named, r.named_why = True, "the run had ended before the fault"
                else:
                    if kind == "launcher-kill":
                        r.codes_ok = first.rc == -signal.SIGKILL
                    else:  # 75, or 0 where the signal came after the last step's stop check
                        said = " ".join(first.stderr().split())
                        r.codes_ok = (first.rc == 75 and "checkpoint saved at step" in said) or first.rc == 0
                    if first.rc != 0:
                        self.resume(r, [])  # (after a launcher kill: once its processes are gone)
                    # the killed launch's processes write its end record after it died: read it now
                    mine = [e for e in events(r.run, "end") if e.get("launch") == launch_of(r.run, first.started)]
                    got = [(str(e.get("reason")), e.get("step")) for e in mine]
                    r.named_why = "; ".join(f"end {reason} at step {step}" for reason, step in got) or "no end record"
                    stopped = [int(step) for reason, step in got if reason == "SIGTERM" and step is not None]
                    completed = got == [("max_steps", steps)]
                    if variant == "rank":
                        r.named = stopped == [r.expected_resume]
                    else:  # the step saved is the one in flight (or the last, if the run ended first)
                        r.named = len(stopped) == 1 or completed
                        r.expected_resume = stopped[0] if stopped else (steps if completed else None)
                    if completed and kind == "term":
                        r.codes_ok = first.rc == 0
            elif kind == "nospace":
                s = rng.choice(self.saves)
                r.instant, r.detail = f"save of step {s}", f"ENOSPC on rank {rank}"
                first = self.run_once(r, [], faults=f"nospace@{s}:{rank}")
                kept = self.prev_save(s)
                r.codes_ok = first.rc == 75 and f"checkpoint step {s} could not be written" in " ".join(
                    first.stderr().split()
                )
                r.fault_time = self.marker_time(r.run, "nospace", s, rank)
                r.expected_resume = kept
                ends = [e for e in events(r.run, "end") if e.get("reason") == "nospace"]
                r.named = len(ends) == 1 and ends[0].get("failed_step") == s and (ends[0].get("step") or None) == kept
                r.named_why = (
                    "; ".join(f"nospace at {e.get('failed_step')}, kept {e.get('step')}" for e in ends) or "none"
                )
                if first.rc != 0:
                    left = r.run / "checkpoints" / f"step{s}"
                    if left.exists():
                        r.problems.append(f"{left} left after the failed save")
                    self.resume(r, [])
            else:
                raise ValueError(kind)
            r.codes_ok = r.codes_ok and all(x.rc == 0 for x in r.launches[1:])  # every resume completes
            if kind != "kill":  # no rank failed (but a hang's culprit): a rank_failed record blames one wrongly
                failed = [
                    f for f in events(r.run, "rank_failed") if not (kind == "stop" and f.get("local_rank") == rank)
                ]
                wrong = [f"rank {f.get('local_rank')}: {f.get('cause')}" for f in failed]
                if wrong and r.named:
                    r.named, r.named_why = False, f"{r.named_why}; but rank_failed: {'; '.join(wrong)}"
            self.check(r, reference)
        finally:
            self.reap(r)
        return r

    # -- checks ---------------------------------------------------------------------------------

    def check(self, r: Round, reference: Path | None) -> None:
        last = r.launches[-1] if r.launches else None
        if last is None or last.rc != 0:
            r.problems.append(f"the run did not complete (last exit {last.rc if last else None})")
        # (a) losses, exactly, and the final state
        want = losses(reference) if reference is not None else self.twin_losses
        recs = records(r.run)
        wrong = [(x["step"], x.get("loss"), want.get(x["step"])) for x in recs if x.get("loss") != want.get(x["step"])]
        steps_seen = sorted({x["step"] for x in recs})
        r.exact = not wrong and steps_seen == list(range(1, self.steps + 1))
        r.exact_why = f"{len(wrong)} of {len(recs)} records differ, first {wrong[:1]}" if wrong else ""
        if steps_seen != list(range(1, self.steps + 1)):
            r.exact_why += f" steps recorded {steps_seen}"
        if reference is not None:  # the skip twin itself must follow the fault-free twin before the skip
            s = r.step or 0
            before = {k: v for k, v in losses(reference).items() if k < s}
            if before != {k: v for k, v in self.twin_losses.items() if k < s}:
                r.exact, r.exact_why = False, f"the skip twin differs from the twin before step {s}"
        final = r.run / "checkpoints" / f"step{self.steps}"
        ref_final = (reference or self.root / "twin") / "checkpoints" / f"step{self.steps}"
        if r.exact and (final / ".metadata.json").is_file():
            same = self.same_state(final, ref_final)
            if same is not True:
                r.exact, r.exact_why = False, f"final state differs: {same}"
        # (c) nothing lost
        problems = []
        ckpts = r.run / "checkpoints"
        for path in sorted(ckpts.glob("step*")) if ckpts.is_dir() else []:
            if not (path / ".metadata.json").is_file():
                problems.append(f"{path.name} left partial")
                continue
            from olmx.worker.checkpoint import verify

            problem = verify(path)
            if problem:
                problems.append(f"{path.name}: {problem}")
        if not (final / ".metadata.json").is_file():
            problems.append(f"no complete step{self.steps}")
        starts = events(r.run, "start")
        later = [s for s in starts if r.fault_time is not None and s["time"] > r.fault_time]
        if later and not r.missed:
            r.resumed_from = later[0].get("resumed_from")
            if (r.resumed_from or 0) < (r.expected_resume or 0):
                problems.append(f"resumed from {r.resumed_from}, the fault left {r.expected_resume}")
            elif r.resumed_from != r.expected_resume and not (r.kind == "launcher-kill" and self.infra):
                problems.append(f"resumed from {r.resumed_from}, expected {r.expected_resume}")
        elif not r.missed and not (r.kind == "launcher-kill" and self.infra):
            problems.append("no attempt started after the fault")
        r.kept, r.kept_why = not problems, "; ".join(problems)
        # (d) goodput and recovery
        good = goodput(r.run) or {}
        r.goodput, r.wall_s = good.get("goodput"), good.get("wall_s")
        r.lost_s = (good.get("seconds") or {}).get("lost")
        if later and not r.missed:
            first_step = [x for x in recs if x.get("time", 0) > later[0]["time"]]
            if first_step:
                r.recovery_s = first_step[0]["time"] - (r.fault_time or 0)

    def same_state(self, a: Path, b: Path) -> bool | str:
        import torch

        sa, sb = self.state(a), self.state(b)
        if sa.keys() != sb.keys():
            return "different keys"
        for k in sa:
            x, y = sa[k], sb[k]
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
                return k
        return True

    def state(self, ckpt: Path) -> dict[str, Any]:
        """Every tensor of a checkpoint's model and optimizer state (the twins' kept)."""
        if ckpt in self._states:
            return self._states[ckpt]
        from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

        d = str(ckpt / "model_and_optim")
        keys = sorted(get_checkpoint_metadata(d).state_dict_metadata)
        state = dict(zip(keys, load_keys(d, keys), strict=True))
        if "twin" in ckpt.parent.parent.name:
            self._states[ckpt] = state
        return state


# -- reading a run --------------------------------------------------------------------------------


def records(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a torn last line of a killed writer
    return out


def losses(run: Path) -> dict[int, float | None]:
    return {x["step"]: x.get("loss") for x in records(run)}


def events(run: Path, kind: str) -> list[dict[str, Any]]:
    from olmx.events import read_events

    return [e for e in read_events(run) if e["event"] == kind]


def goodput(run: Path) -> dict[str, Any] | None:
    path = run / "summary.json"
    try:
        return json.loads(path.read_text()).get("goodput")
    except (OSError, ValueError):
        return None


def job_id(run: Path) -> str | None:
    try:
        return str(json.loads((run / "launch.json").read_text())["job_id"])
    except (OSError, ValueError, KeyError):
        return None


def launch_of(run: Path, since: float) -> str | None:
    """The launch id of the first attempt that started after ``since``."""
    later = [e for e in events(run, "start") if e["time"] >= since]
    return later[0].get("launch") if later else None


def named_nonfinite(event: dict[str, Any], step: int, rank: int, action: str) -> bool:
    return (event.get("step"), event.get("ranks"), event.get("verdict"), event.get("action")) == (
        step,
        [rank],
        "this rank",
        action,
    )


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def source_of(soak: Soak) -> str:
    """Where olmx, its conf and its plugins are imported from in the runs, and the commit."""
    code = "import olmx, olmx.conf as c, olmx_plugins as p; print(olmx.__path__[0], c.__path__[0], p.__path__[0])"
    where = subprocess.run([sys.executable, "-c", code], env=soak.env, cwd=soak.src, capture_output=True, text=True)
    commit = subprocess.run(
        ["git", "-C", str(soak.src), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(soak.src), "status", "--porcelain", "--untracked-files=no", "--", *CODE],
        capture_output=True,
        text=True,
    )
    state = "clean" if commit.returncode == 0 and not dirty.stdout.strip() else "with uncommitted changes"
    return f"commit {commit.stdout.strip() or '?'} ({state}); olmx, olmx.conf, olmx_plugins from {where.stdout.strip()}"


# -- the report -----------------------------------------------------------------------------------


def table(rounds: list[Round], soak: Soak) -> list[str]:
    twin = soak.twin_goodput.get("goodput")
    lines = [
        "| # | fault | instant | exit codes | named right | losses exact | nothing lost | resumed from | "
        "goodput (twin) | wall s | recovery s | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        codes = " -> ".join(str(x.rc) for x in r.launches)
        named = "yes" if r.named else f"**no** ({r.named_why})"
        if r.missed:
            named = "n/a (the run ended first)"
        exact = "yes" if r.exact else f"**no** ({r.exact_why})"
        kept = "yes" if r.kept else f"**no** ({r.kept_why})"
        resumed = "-" if r.missed else str(r.resumed_from if r.resumed_from is not None else "scratch")
        ok = ("yes" if r.ok else "**no**") + (f" ({'; '.join(r.problems)})" if r.problems else "")
        lines.append(
            f"| {r.i} | {r.kind}: {r.detail} | {r.instant} | {codes}{'' if r.codes_ok else ' **unexpected**'} | "
            f"{named} | {exact} | {kept} | {resumed} | {fmt(r.goodput, '.4f')} ({fmt(twin, '.4f')}) | "
            f"{fmt(r.wall_s, '.1f')} | {fmt(r.recovery_s, '.1f')} | {ok} |"
        )
    return lines


def summary(rounds: list[Round], soak: Soak) -> list[str]:
    n = len(rounds)
    landed = [r for r in rounds if not r.missed]
    recov = [r.recovery_s for r in rounds if r.recovery_s is not None]
    goods = [r.goodput for r in rounds if r.goodput is not None]
    walls = [r.wall_s for r in rounds if r.wall_s is not None]
    twin = soak.twin_goodput
    by_kind = []
    for kind in KINDS:
        mine = [r.recovery_s for r in rounds if r.kind == kind and r.recovery_s is not None]
        count = sum(r.kind == kind for r in rounds)
        if count:
            by_kind.append(f"{kind} {count} ({fmt(statistics.median(mine) if mine else None, '.1f')} s)")
    median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return [
        f"- rounds: **{n}** ({', '.join(by_kind)}: rounds, median recovery); the fault landed in "
        f"{len(landed)} (a signal sent after the run ended is not counted as a fault)",
        f"- failures named right: **{sum(r.named for r in landed)}/{len(landed)}**; exit codes as documented: "
        f"**{sum(r.codes_ok for r in rounds)}/{n}**",
        f"- losses exact (every record, and the final model and optimizer state bit for bit): "
        f"**{sum(r.exact for r in rounds)}/{n}**; nothing lost (every published checkpoint verifies, none "
        f"partial, resumed from the right one): **{sum(r.kept for r in rounds)}/{n}**",
        f"- median recovery (fault to the first step of the resumed attempt): **{fmt(median(recov), '.1f')} s** "
        f"(min {fmt(min(recov) if recov else None, '.1f')}, max {fmt(max(recov) if recov else None, '.1f')})",
        f"- goodput: median **{fmt(median(goods), '.4f')}** against the twin's **{fmt(twin.get('goodput'), '.4f')}** "
        f"(ratio {fmt(median(goods) / twin['goodput'] if goods and twin.get('goodput') else None, '.2f')}); "
        f"wall time median {fmt(median(walls), '.1f')} s against {fmt(twin.get('wall_s'), '.1f')} s",
        f"- rounds ok in every respect: **{sum(r.ok for r in rounds)}/{n}**",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=None, help="replays the choices (default: a random seed, printed)")
    ap.add_argument("--infra", choices=("local", "slurm"), default="local")
    ap.add_argument("--record", action="store_true", help="append to benchmarks/results/soak.md, rebuild RESULTS.md")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--save-interval", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(KINDS), help="a comma-separated subset of " + ", ".join(KINDS))
    ap.add_argument("--src", default=None, help="the olmx checkout to run (default: this one)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.randrange(2**32)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or args.steps < 4 or args.save_interval < 1 or args.save_interval > args.steps:
        ap.error(f"unknown kinds {unknown}" if unknown else "--steps >= 4 and 1 <= --save-interval <= --steps")
    soak = Soak(args)
    sys.path.insert(0, str(soak.src))
    print(f"chaos soak: seed {args.seed}, {args.rounds} rounds, infra {args.infra}, runs in {soak.root}", flush=True)
    source = source_of(soak)
    print(f"olmx: {source}", flush=True)
    t0 = time.time()
    if soak.twin():
        return 1
    order: list[str] = []
    while len(order) < args.rounds:  # every kind once per cycle, in a random order
        cycle = list(kinds)
        soak.rng.shuffle(cycle)
        order += cycle
    rounds = []
    for i, kind in enumerate(order[: args.rounds], 1):
        started = time.time()
        r = soak.round(i, kind)
        rounds.append(r)
        print(
            f"round {i} {kind}: {r.detail} at {r.instant}; exits {[x.rc for x in r.launches]}, named "
            f"{r.named} ({r.named_why}), exact {r.exact}{' ' + r.exact_why if r.exact_why else ''}, kept {r.kept}"
            f"{' ' + r.kept_why if r.kept_why else ''}, resumed from {r.resumed_from}, goodput "
            f"{fmt(r.goodput, '.4f')}, recovery {fmt(r.recovery_s, '.1f')} s"
            f"{', problems: ' + '; '.join(r.problems) if r.problems else ''} [{time.time() - started:.0f} s]",
            flush=True,
        )
    wall = time.time() - t0
    lines = table(rounds, soak) + [""] + summary(rounds, soak)
    print("\n".join(lines))
    if args.record:
        record(args, rounds, lines, source, wall)
    return 0 if all(r.ok for r in rounds) else 1


def record(args: argparse.Namespace, rounds: list[Round], lines: list[str], source: str, wall: float) -> None:
    path = REPO / "benchmarks" / "results" / "soak.md"
    command = "python benchmarks/soak.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    infra = "the local one-node Slurm cluster of scripts/slurm/up.sh (`infra=slurm`)" if args.infra == "slurm" else ""
    head = (
        f"## {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}: {len(rounds)} rounds, "
        f"{'Slurm' if args.infra == 'slurm' else 'local'}, seed {args.seed}"
    )
    text = [
        head,
        "",
        f"Machine: {os.cpu_count()} CPU cores ({platform.machine()}, shared; load average "
        f"{os.getloadavg()[0]:.1f} at the end), 2 gloo processes{', on ' + infra if infra else ''}; the tests' "
        f"SMALL run, {args.steps} steps, a checkpoint every {args.save_interval}; {wall / 60:.0f} min in all. "
        f"olmx: {source}.",
        "",
        f"Command: `{command}`",
        "",
        *lines,
        "",
    ]
    if not path.exists():
        path.write_text(
            "# Chaos soak (`benchmarks/soak.py`)\n\nReal `olmx train` runs, each driven into one fault at a random "
            "instant and resumed to the end, against a fault-free twin (the script's docstring says what each "
            "fault is and what is checked).\n\n"
        )
    with open(path, "a") as f:
        f.write("\n".join(text) + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "collect_results.py")], check=True)
    print(f"recorded in {path} and benchmarks/RESULTS.md")


if __name__ == "__main__":
    raise SystemExit(main())
