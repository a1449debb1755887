"""Fault tolerance through the real CLI: preemption (SIGTERM), a killed rank with and without
elastic restarts, a save killed halfway, a corrupt checkpoint, non-finite steps in both modes,
unwritable and full run directories, signals and kills at random instants of a run (planning,
start-up, steps, saves). Every interrupted run is compared, bitwise, with the same
run left alone (CPU, gloo, deterministic ops).

Faults inside the workers are placed with ``OLMX_FAULTS`` (olmx/worker/faults.py); the
preemption is a real SIGTERM sent to ``olmx train``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from olmx.events import EXIT_NONFINITE, EXIT_PREEMPTED, read_events
from olmx.launch.failures import attempt_failures
from tests.conftest import olmx_cli
from tests.test_training import REFERENCE_STEPS, SMALL

pytestmark = pytest.mark.dist

ONE = ["infra.nproc_per_node=1", "parallel=[]"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def train(run_dir: Path, env: dict, *overrides: str, faults: str = "") -> subprocess.CompletedProcess:
    return olmx_cli("train", *SMALL, f"trainer.run_dir={run_dir}", *overrides, env={**env, "OLMX_FAULTS": faults})


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs}


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == kind]


def checkpoint_state(ckpt: Path) -> dict:
    """Every tensor of a checkpoint's model and optimizer state (unsharded, in this process)."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

    d = str(ckpt / "model_and_optim")
    keys = sorted(get_checkpoint_metadata(d).state_dict_metadata)
    return dict(zip(keys, load_keys(d, keys), strict=True))


def assert_same_state(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    same = lambda x, y: torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y  # noqa: E731
    different = [k for k in a if not same(a[k], b[k])]
    assert sum(isinstance(v, torch.Tensor) and v.numel() > 1 for v in a.values()) >= 3 * 21  # params + 2 moments
    assert not different, different[:5]


def explain(proc: subprocess.CompletedProcess, run_dir: Path) -> str:
    log = run_dir / "logs" / "node0.log"
    return proc.stdout[-2000:] + proc.stderr[-3000:] + (log.read_text()[-4000:] if log.exists() else "")


def test_preempted_and_killed_run_resumes_to_the_uninterrupted_result(tmp_path, cache, reference_run):
    steps = REFERENCE_STEPS
    ref = reference_run

    # 1. SIGTERM to `olmx train` while rank 0 is held inside step 5: both ranks finish step 5,
    #    save it, and `olmx train` exits 75.
    run = tmp_path / "run"
    env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", **cache, "OLMX_FAULTS": "hold@5:0"}
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "olmx", "train", *SMALL, f"trainer.run_dir={run}", *steps],
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists() or len(records(run)) < 4:
            assert p.poll() is None and time.monotonic() < deadline, "the run ended before step 4"
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
    err = (tmp_path / "err").read_text()
    assert p.returncode == EXIT_PREEMPTED, (tmp_path / "out").read_text() + err
    assert "stopped by SIGTERM; checkpoint saved at step 5" in err and "to resume" in err
    assert (run / "checkpoints" / "step5" / ".metadata.json").is_file()
    assert [e["reason"] for e in events(run, "end")] == ["SIGTERM"] and events(run, "end")[0]["step"] == 5
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5]

    # 2. Resume; rank 1 is SIGKILLed inside step 9; torchrun restarts the group, which resumes
    #    from the step-8 checkpoint and finishes.
    proc = train(run, cache, *steps, "infra.max_restarts=1", faults="kill@9:1")
    assert proc.returncode == 0, explain(proc, run)
    assert "Resuming from the checkpoint at step 5" in proc.stdout
    assert "restarted after node 0 local rank 1 (attempt 0)" in proc.stderr
    failed = events(run, "rank_failed")
    assert len(failed) == 1 and failed[0]["local_rank"] == 1 and "SIGKILL" in failed[0]["cause"]
    starts = events(run, "start")
    assert [(s["attempt"], s["resumed_from"]) for s in starts] == [(0, None), (0, 5), (1, 8)]

    # 3. Same loss at every step and the same final model and optimizer state, bit for bit.
    assert losses(records(run)) == losses(records(ref))
    assert sorted(losses(records(run))) == list(range(1, 13))
    assert_same_state(
        checkpoint_state(run / "checkpoints" / "step12"), checkpoint_state(ref / "checkpoints" / "step12")
    )


def test_save_killed_halfway_and_corrupt_checkpoint_fall_back_to_the_last_good_one(tmp_path, cache):
    run = tmp_path / "run"
    steps = ["trainer.max_steps=8", "trainer.save_interval=2", *ONE]
    proc = train(run, cache, *steps, faults="killsave@6:0")
    assert proc.returncode != 0
    first = losses(records(run))
    ckpts = run / "checkpoints"
    assert (ckpts / "step6").is_dir() and not (ckpts / "step6" / ".metadata.json").exists()  # never published
    assert all((ckpts / f"step{s}" / ".metadata.json").is_file() for s in (2, 4))
    # Damage step 4 in place (same size): only its checksums can tell.
    victim = max((ckpts / "step4" / "model_and_optim").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    proc = train(run, cache, *steps)
    assert proc.returncode == 0, explain(proc, run)
    assert [Path(e["path"]).name for e in events(run, "checkpoint_partial")] == ["step6"]
    corrupt = events(run, "checkpoint_corrupt")
    assert len(corrupt) == 1 and corrupt[0]["step"] == 4 and victim.name in corrupt[0]["problem"]
    assert (ckpts / "step4.corrupt").is_dir()
    assert events(run, "start")[-1]["resumed_from"] == 2
    again = losses(records(run))
    assert sorted(again) == list(range(1, 9))
    assert {s: again[s] for s in range(1, 7)} == {s: first[s] for s in range(1, 7)}  # recomputed 3..6 exactly


def test_nonfinite_loss_skip_and_stop(tmp_path, cache):
    steps = ["trainer.max_steps=5", "trainer.save_interval=3"]
    skip = tmp_path / "skip"
    proc = train(skip, cache, *steps, "trainer.on_nonfinite=skip", faults="nan@3:1")  # rank 1 only
    assert proc.returncode == 0, explain(proc, skip)
    recs = {r["step"]: r for r in records(skip)}
    assert sorted(recs) == [1, 2, 3, 4, 5]
    assert recs[3]["loss"] is None and recs[3]["skipped"] is True
    assert all(recs[s]["loss"] is not None and recs[s]["loss"] == recs[s]["loss"] for s in (1, 2, 4, 5))
    summary = json.loads((skip / "summary.json").read_text())
    assert summary["nonfinite_steps"] == [3] and summary["steps"] == 5
    # Rank 1 alone is broken for that step: its loss, and its replay on itself, fail at the
    # embeddings; its micro-batches replayed on rank 0 are fine.
    [bad] = events(skip, "nonfinite")
    assert (bad["step"], bad["verdict"], bad["ranks"], bad["module"]) == (3, "this rank", [1], "embeddings")
    rank0, rank1 = bad["by_rank"]
    assert rank0["loss"] > 0 and rank1["loss"] is None and rank1["replay"]["module"] == "embeddings"
    assert rank0["replayed_other"] == {**rank0["replayed_other"], "dp_rank": 1, "module": None, "bad": False}
    assert rank0["replay"]["loss"] == rank0["loss"]  # the replay is the step's forward again
    assert all(len(r["documents"]) == 4 and all(off % 64 == 0 for _, off in r["documents"]) for r in bad["by_rank"])

    stop = tmp_path / "stop"
    proc = train(stop, cache, *steps, "trainer.on_nonfinite=stop", faults="nan@3:1")
    assert proc.returncode == EXIT_NONFINITE, explain(proc, stop)
    assert "non-finite" in proc.stderr and "step 3" in proc.stderr
    said = " ".join(proc.stderr.split())
    assert "verdict: this rank (only rank 1 failed" in said and "first non-finite output: embeddings" in said
    assert "suspect its device or node" in said and "lower the learning rate" not in said  # advice by verdict
    assert events(stop, "end")[-1] == {**events(stop, "end")[-1], "reason": "nonfinite", "step": 3}
    # The stop checkpoint holds the last good state: the same as the skipping run's step 3
    # (the state after step 2), optimizer moments included.
    assert_same_state(
        checkpoint_state(stop / "checkpoints" / "step3"), checkpoint_state(skip / "checkpoints" / "step3")
    )


def test_nonfinite_verdicts_every_rank_and_poisoned_data(tmp_path, cache):
    """Every rank failing, each on its own data, is numerics; a token file one sequence of
    which fails wherever it is read (``poison``: the vocabulary's last id embeds as inf) is
    data, and the event names that file and the sequence's offset."""
    steps = ["trainer.max_steps=3", "trainer.on_nonfinite=skip"]
    every = tmp_path / "every"
    proc = train(every, cache, *steps, faults="nan@2")
    assert proc.returncode == 0, explain(proc, every)
    [bad] = events(every, "nonfinite")
    assert (bad["step"], bad["verdict"], bad["ranks"], bad["module"]) == (2, "numerics", [0, 1], "embeddings")
    assert bad["reason"] == "every rank failed, each on its own data"

    import numpy as np

    ids = np.random.default_rng(0).integers(0, 256, size=(24, 64)).astype(np.uint16)  # 3 steps of 8
    ids[:, -1] = 256
    ids[13, 20] = 257  # the byte vocabulary's last id (its pad), poisoned
    data = tmp_path / "tokens.u16"
    ids.tofile(data)
    poisoned = tmp_path / "poisoned"
    byte_vocab = [f"data.tokenizer.{k}={v}" for k, v in (("name", "bytes"), ("vocab_size", 258), ("eos_id", 256))]
    data_args = ["data=numpy", f"data.paths=[{data}]", *byte_vocab, "data.tokenizer.pad_id=257", "eval.interval=0"]
    proc = train(poisoned, cache, *steps, *data_args, faults="poison@1")
    assert proc.returncode == 0, explain(proc, poisoned)
    [bad] = events(poisoned, "nonfinite")  # the one step whose batch holds sequence 13
    [rank] = bad["ranks"]
    assert bad["verdict"] == "data" and bad["module"] == "embeddings"
    assert bad["reason"] == f"rank {rank}'s micro-batches fail again when replayed on rank {1 - rank}"
    assert bad["failing_documents"] == [[str(data), 13 * 64]]
    docs = {tuple(d) for r in bad["by_rank"] for d in r["documents"]}
    assert len(docs) == 8 and (str(data), 13 * 64) in docs
    assert sorted(losses(records(poisoned))) == [1, 2, 3]


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


def test_unwritable_and_full_run_directories_fail_before_training(tmp_path, cache):
    # Root ignores permission bits, so read-only and full file systems are real tmpfs mounts.
    ro, small = tmp_path / "ro", tmp_path / "small"
    if not _mount_tmpfs(ro, "ro,size=1m"):
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        assert _mount_tmpfs(small, "size=1500k")
        proc = train(ro / "run", cache, *ONE)
        assert proc.returncode == 2 and "trainer.run_dir" in proc.stderr and "Read-only file system" in proc.stderr
        assert not any(ro.iterdir())

        proc = train(small / "run", cache, *ONE, "trainer.max_steps=4")
        assert proc.returncode == 1
        assert "MiB free; a checkpoint of this model needs about" in proc.stderr, explain(proc, small / "run")
        assert not (small / "run" / "metrics.jsonl").exists()
        assert not list((small / "run" / "checkpoints").glob("*"))  # nothing half-written
    finally:
        for mount in (ro, small):
            subprocess.run(["umount", str(mount)], capture_output=True)


def test_root_cause_prefers_the_silent_rank_over_its_peer():
    """torchrun names the first failure by error-file time in whole seconds; a rank that only
    lost its peer must not be blamed for the one that was killed."""
    console = "[E] failed (exitcode: 1) local_rank: 0 (pid: 11) of binary: python\n"

    def attempt(root: Path, errors: dict[int, str | None]) -> Path:
        for rank, message in errors.items():
            d = root / "attempt_0" / str(rank)
            d.mkdir(parents=True)
            (d / "stderr.log").write_text(f"rank {rank} line 1\nrank {rank} last line\n")
            if message is not None:
                (d / "error.json").write_text(json.dumps({"message": {"message": message}}))
        return root

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        lost = attempt(Path(tmp) / "a", {0: "RuntimeError: Read error: Connection reset by peer", 1: None})
        [f] = attempt_failures(console, lost)
        assert (f.local_rank, f.exitcode) == (1, None) and "without a Python error" in f.cause
        assert f.tail.endswith("rank 1 last line")
        own = attempt(Path(tmp) / "b", {0: "ValueError: bad batch", 1: None})
        [f] = attempt_failures(console, own)
        assert (f.local_rank, f.cause) == (0, "raised ValueError: bad batch")


def test_a_planned_exit_is_no_rank_failure(tmp_path):
    """Workers that stop the run themselves exit 75 (a stop, a full disk), 76 (non-finite) or
    77 (hang); torchrun's line then names whichever rank exited first, a healthy one. The end or
    hang record names the cause: no ``rank_failed`` record (once one blamed rank 0 for rank 1's
    NaN) and no "restarted after" line. A real failure is still recorded."""
    from olmx.launch.failures import FailureRecorder

    log = tmp_path / "node0.log"
    (tmp_path / "run").mkdir()
    recorder = FailureRecorder(tmp_path / "run", log, offset=0, since=0.0, node_rank=0, launch="a")
    lines = [f"[E] failed (exitcode: {code}) local_rank: 0 (pid: 11) of binary: python\n" for code in (75, 76, 77)]
    log.write_text("".join(lines))
    assert recorder.poll() == [] and not events(tmp_path / "run", "rank_failed")
    log.write_text(log.read_text() + "[E] failed (exitcode: -9) local_rank: 1 (pid: 12) of binary: python\n")
    [f] = recorder.poll()
    assert (f.attempt, f.local_rank, f.cause) == (3, 1, "killed by SIGKILL (exit code -9)")
    assert [e["local_rank"] for e in events(tmp_path / "run", "rank_failed")] == [1]


def test_outcome_of_a_launch_is_read_from_its_own_events(tmp_path, monkeypatch):
    """The contract launchers and batch scripts rely on (``python -m olmx.events RUN_DIR [LAUNCH]``)."""
    from olmx.events import LAUNCH_ENV, append_event, main, outcome

    monkeypatch.setenv(LAUNCH_ENV, "a")
    append_event(tmp_path, "start", attempt=0, resumed_from=None)
    append_event(tmp_path, "end", reason="SIGTERM", step=7)
    monkeypatch.setenv(LAUNCH_ENV, "b")
    append_event(tmp_path, "start", attempt=0, resumed_from=7)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"event": "end", "reas')  # a torn last line (killed mid-write) is ignored

    def triple(o):
        return o.state, o.exit_code, o.step

    assert triple(outcome(tmp_path, launch="a")) == ("stopped", EXIT_PREEMPTED, 7)
    assert triple(outcome(tmp_path, launch="b", returncode=1)) == ("failed", 1, None)
    append_event(tmp_path, "end", reason="nonfinite", step=9)
    assert triple(outcome(tmp_path, launch="b")) == ("nonfinite", EXIT_NONFINITE, 9)
    append_event(tmp_path, "start", attempt=1, resumed_from=9)  # a later attempt: its end counts
    append_event(tmp_path, "end", reason="max_steps", step=20)
    assert main([str(tmp_path), "b"]) == 0 and main([str(tmp_path), "a"]) == EXIT_PREEMPTED
    assert main([str(tmp_path)]) == 0
    # A stop before the first step of a fresh run saved nothing, and says so ("checkpoint saved at
    # step 0" would name a checkpoint never written); its code is 75 as at every other phase.
    monkeypatch.setenv(LAUNCH_ENV, "c")
    append_event(tmp_path, "start", attempt=0, resumed_from=None)
    append_event(tmp_path, "end", reason="SIGTERM", step=0)
    early = outcome(tmp_path, launch="c")
    assert triple(early) == ("stopped", 75, 0) and "no checkpoint was saved" in early.message


def test_resume_prunes_checkpoints_of_earlier_attempts(tmp_path):
    """OLMo-core trims only the checkpoints its own process saved; at resume olmx keeps the
    checkpointer's max_checkpoints newest complete ones (completion mark removed first)."""
    from types import SimpleNamespace

    from olmx.worker.checkpoint import METADATA, _prune, checkpoint_dirs

    for step in (10, 20, 30, 40, 50):
        (tmp_path / f"step{step}" / "train").mkdir(parents=True)
        (tmp_path / f"step{step}" / METADATA).write_text("{}")
    (tmp_path / "step60").mkdir()  # never published
    (tmp_path / "step70-tmp").mkdir()
    complete, partial = checkpoint_dirs(tmp_path)
    assert [s for s, _ in complete] == [50, 40, 30, 20, 10]
    assert [p.name for p in partial] == ["step60", "step70-tmp"]
    _prune(complete[1:], SimpleNamespace(callbacks={"checkpointer": SimpleNamespace(max_checkpoints=3)}))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step20",
        "step30",
        "step40",
        "step50",
        "step60",
        "step70-tmp",
    ]


#: Where :func:`test_signals_and_kills_at_random_instants_resume_to_the_uninterrupted_result`
#: interrupts a launch: a random delay after one of these moments.
PHASES = ("planning", "start-up", "step", "save")
#: What it sends: Ctrl-C (once, or twice 0.2 s apart), SIGTERM, SIGHUP to ``olmx train``, or
#: SIGKILL to every process of the launch at once (a machine lost; only once training runs).
FAULTS = ("SIGINT", "SIGINT SIGINT", "SIGTERM", "SIGHUP", "SIGKILL")


def _interrupt(run: Path, cache: dict, rng, steps: list[str]) -> tuple[str, str, int, str]:
    """One ``olmx train`` of ``run`` interrupted at a random instant of a random phase; checks
    what every interruption must leave and returns (phase, fault, exit code, stderr)."""
    import uuid

    from olmx.rundir import LOCK_FILE, processes_with_env

    phase, fault = rng.choice(PHASES), rng.choice(FAULTS)
    if fault == "SIGKILL" and phase in ("planning", "start-up"):
        phase = "step"
    tag = uuid.uuid4().hex  # in the environment of the launcher and all it starts
    env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", **cache, "OLMX_FAULTS": "", "OLMX_TEST_LAUNCH": tag}
    started = time.time()
    fresh = lambda path: path.exists() and path.stat().st_mtime >= started  # noqa: E731
    done = len(records(run)) if (run / "metrics.jsonl").exists() else 0
    k = rng.randint(1, 3)
    ready = {
        "planning": lambda: True,
        "start-up": lambda: fresh(run / "launch.json"),
        "step": lambda: (run / "metrics.jsonl").exists() and len(records(run)) >= done + k,
        "save": lambda: sum(map(fresh, (run / "checkpoints").glob("step*"))) >= k,
    }[phase]
    delay = rng.uniform(0, {"planning": 4.0, "start-up": 4.0, "step": 0.6, "save": 0.4}[phase])
    err_path = run.parent / f"{run.name}.{tag}.err"
    with open(err_path, "w+") as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "olmx", "train", *SMALL, f"trainer.run_dir={run}", *steps],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 300
            while not ready() and p.poll() is None:
                assert time.monotonic() < deadline, f"timed out waiting for phase {phase}"
                time.sleep(0.05)
            time.sleep(delay)
            if fault == "SIGKILL":
                for pid in [p.pid, *processes_with_env("OLMX_TEST_LAUNCH", tag)]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            else:
                for name in fault.split():
                    p.send_signal(signal.Signals[name])
                    time.sleep(0.2)
            p.wait(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
    stderr = err_path.read_text()
    what = (phase, round(delay, 2), fault, p.returncode, stderr[-3000:])
    # Nothing of the launch outlives olmx train (after a SIGKILL, the workers it missed follow).
    deadline = time.monotonic() + 60
    while processes_with_env("OLMX_TEST_LAUNCH", tag):
        assert fault == "SIGKILL" and time.monotonic() < deadline, what
        time.sleep(0.2)
    if fault == "SIGKILL":
        return phase, fault, p.returncode, stderr
    assert "Traceback" not in stderr, what
    # one code for "stopped, resume me" at every phase (planning, start-up, steps, saves): 75
    expected = {"SIGINT": {130}, "SIGTERM": {75}, "SIGHUP": {75}}[fault.split()[0]]
    # 0: the run ended before the signal came; -N: the signal came before olmx installed its
    # handlers (planning: nothing was started, nothing is left but a stale lock).
    assert p.returncode in expected | {0, -signal.Signals[fault.split()[0]].value}, what
    if p.returncode == -signal.Signals[fault.split()[0]].value:
        assert not fresh(run / "launch.json"), what  # killed before it launched anything
    else:
        assert not (run / LOCK_FILE).exists(), what  # released by the launcher that held it, at the end
    import re

    named = re.search(r"checkpoint saved at step (\d+)", " ".join(stderr.split()))
    if named:
        assert (run / "checkpoints" / f"step{named.group(1)}" / ".metadata.json").is_file(), what
    if p.returncode == 75:  # it names the checkpoint a rerun resumes from, or says none was saved
        said = " ".join(stderr.split())
        nothing = ("before the launch", "before the first step", "before its processes saved anything")
        assert named or any(n in said for n in nothing), what
    return phase, fault, p.returncode, stderr


def test_signals_and_kills_at_random_instants_resume_to_the_uninterrupted_result(tmp_path, cache, reference_run):
    """Fault injection at random instants (the seed is printed; ``OLMX_FAULT_SEED`` replays it,
    ``OLMX_FAULT_ROUNDS`` sets how many interruptions): a launch with a checkpoint every step is
    interrupted during planning, start-up, a step or a save, by Ctrl-C (once or twice), SIGTERM,
    SIGHUP, or a SIGKILL of all its processes at once. Each signal ends in one message with
    exit 130 (Ctrl-C), 75 and the checkpoint it names, or the signal's own code when nothing was
    saved; olmx train never returns while a process of the launch runs and releases the lock
    only then. Then the run is resumed to its end: the same losses and the same final model and
    optimizer state, bit for bit, as the run left alone."""
    import random

    seed = int(os.environ.get("OLMX_FAULT_SEED", random.randrange(2**32)))
    rounds = int(os.environ.get("OLMX_FAULT_ROUNDS", 3))
    print(f"fault seed {seed}")
    rng = random.Random(seed)
    run = tmp_path / "run"
    steps = [*REFERENCE_STEPS, "trainer.save_interval=1"]
    seen = [_interrupt(run, cache, rng, steps)[:3] for _ in range(rounds)]
    print(seen)
    proc = train(run, cache, *steps)
    assert proc.returncode == 0, (seed, seen, explain(proc, run))
    ref = reference_run
    assert losses(records(run)) == losses(records(ref)), (seed, seen)
    assert_same_state(
        checkpoint_state(run / "checkpoints" / "step12"), checkpoint_state(ref / "checkpoints" / "step12")
    )
