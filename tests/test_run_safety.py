"""Run safety through the real CLI: one writer per run directory (a lock, stale locks taken
over), the launcher's death ending its workers (SIGKILL, SIGHUP), olmx deleting only what it
wrote (foreign folders refused, ``trainer.resume=false`` moving checkpoints aside), workers
importing the installed olmx from any working directory, credentials and resume compatibility
checked before anything is written, ``olmx jobs`` on local runs, plain progress lines without a
terminal, the exception quoted when a rank fails, and ``olmx report --compare``.

Processes are real: ``olmx train`` with torchrun and one gloo worker (``ONE``) on the small
model of tests/test_training.py; faults are placed with ``OLMX_FAULTS`` (``hold@N``: the rank
waits inside step N until a stop signal arrives).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from olmx.errors import ConfigError
from olmx.events import EXIT_PREEMPTED, read_events
from olmx.rundir import LOCK_ENV, LOCK_FILE, MARKER_FILE, Holder, RunDir, processes_with_env
from tests.conftest import OLMX, olmx_cli
from tests.test_training import SMALL

pytestmark = pytest.mark.dist

ONE = ["infra.nproc_per_node=1", "parallel=[]"]
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def start(run_dir: Path, env: dict, *overrides: str, faults: str = "", cmd: list[str] | None = None, cwd=None):
    """``olmx train`` in the background, its output in files next to the run directory."""
    full = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "COLUMNS": "200", **env, "OLMX_FAULTS": faults}
    name = run_dir.name
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    out, err = open(run_dir.parent / f"{name}.out", "w"), open(run_dir.parent / f"{name}.err", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [*(cmd or OLMX), "train", *SMALL, f"trainer.run_dir={run_dir}", *overrides],
        env=full,
        stdout=out,
        stderr=err,
        cwd=cwd,
    )
    proc.outputs = (Path(out.name), Path(err.name))  # type: ignore[attr-defined]
    return proc


def output(proc) -> tuple[str, str]:
    return proc.outputs[0].read_text(), proc.outputs[1].read_text()


def explain(proc, run_dir: Path) -> str:
    out, err = output(proc) if hasattr(proc, "outputs") else (proc.stdout, proc.stderr)
    log = run_dir / "logs" / "node0.log"
    return out[-2000:] + err[-3000:] + (log.read_text()[-3000:] if log.exists() else "")


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == kind]


def node_log(run_dir: Path) -> str:
    path = run_dir / "logs" / "node0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for(condition, proc, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"olmx train ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else b"/") for p in sorted(path.rglob("*"))}


def test_one_writer_per_run_dir_and_a_killed_launcher_ends_its_workers(tmp_path, cache):
    run = tmp_path / "run"
    steps = ["trainer.max_steps=6", "trainer.save_interval=100", *ONE]
    first = start(run, cache, *steps, faults="hold@3:0")
    try:
        wait_for(lambda: "injecting fault hold at step 3" in node_log(run), first, "the hold in step 3")
        holder = RunDir(run).lock_holder()
        assert holder is not None and (holder.pid, holder.host) == (first.pid, HOST)
        before = tree(run)

        # A second olmx train on the same directory refuses, naming the holder; writes nothing.
        second = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *steps, env=cache)
        assert second.returncode == 2, second.stdout + second.stderr
        message = " ".join(second.stderr.split())
        assert f"trainer.run_dir: '{run}' is in use by olmx train (pid {first.pid} on host {HOST}" in message
        assert "Traceback" not in second.stderr
        assert tree(run) == before

        status = olmx_cli("jobs", "status", str(run))
        assert status.returncode == 0 and ": alive" in status.stdout and "progress: step 2/6" in status.stdout

        # SIGKILL of the launcher: torchrun gets SIGTERM (parent-death signal), passes it on; the
        # worker finishes step 3, saves it and exits. Nothing of the launch is left running.
        killed = time.monotonic()
        first.kill()
        first.wait()
        while processes_with_env(LOCK_ENV, holder.token):
            assert time.monotonic() - killed < 60, "workers still running 60 s after the launcher was killed"
            time.sleep(0.2)
        gone_after = time.monotonic() - killed
    finally:
        if first.poll() is None:
            first.kill()
    assert gone_after < 30, gone_after
    assert [(e["reason"], e["step"]) for e in events(run, "end")] == [("SIGTERM", 3)]
    assert (run / "checkpoints" / "step3" / ".metadata.json").is_file()
    assert RunDir(run).lock_holder() == holder  # the dead launcher's lock is left: stale
    status = olmx_cli("jobs", "status", str(run))
    assert status.returncode == 0 and ": ended: stopped by SIGTERM; checkpoint saved at step 3" in status.stdout

    # The next olmx train takes the stale lock over and resumes; a longer run rebuilds the schedule.
    again = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *steps, "trainer.max_steps=8", env=cache)
    assert again.returncode == 0, explain(again, run)
    text = " ".join(again.stdout.split())
    assert f"took over the run directory's lock from olmx train (pid {first.pid} on host {HOST}" in text
    assert "Resuming from the checkpoint at step 3" in text
    assert "trainer.max_steps 6 -> 8: the learning-rate schedule (cosine, 2 warm-up steps) is rebuilt for 8" in text
    assert [r["step"] for r in records(run)] == list(range(1, 9))
    assert not (run / LOCK_FILE).exists()
    # Not a terminal: plain progress lines (one per step for 8 steps), the last at 100%.
    lines = [line for line in again.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [f"{s}/8" for s in range(4, 9)], again.stderr
    assert lines[-1].startswith("step 8/8 (100%), loss ")


def test_a_repeated_ctrl_c_waits_for_the_checkpoint_and_keeps_the_lock(tmp_path, cache):
    """Two Ctrl-C 0.2 s apart: olmx train returned at once with 130, released the lock and left
    torchrun and its workers training (the second KeyboardInterrupt escaped the wait). Now it
    returns only once they are gone, holding the lock until then, with the checkpoint it names."""
    run = tmp_path / "run"
    steps = ["trainer.max_steps=6", "trainer.save_interval=100", *ONE]
    proc = start(run, cache, *steps, faults="hold@2:0")
    try:
        wait_for(lambda: "injecting fault hold at step 2" in node_log(run), proc, "the hold in step 2")
        holder = RunDir(run).lock_holder()
        assert holder is not None
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, explain(proc, run)
    assert not processes_with_env(LOCK_ENV, holder.token)  # nothing of the run outlives olmx train
    assert not (run / LOCK_FILE).exists()  # released at the end, by the launcher that held it
    assert [(e["reason"], e["step"]) for e in events(run, "end")] == [("SIGINT", 2)]
    assert (run / "checkpoints" / "step2" / ".metadata.json").is_file()
    assert "still stopping" in output(proc)[1]


def test_sighup_fresh_start_cancel_and_a_changed_model_on_resume(tmp_path, cache):
    run = tmp_path / "run"
    steps = ["trainer.max_steps=4", "trainer.save_interval=100", *ONE]
    # SIGHUP (a closed terminal) stops the run like SIGTERM: checkpoint, exit 75.
    hup = start(run, cache, *steps, faults="hold@2:0")
    try:
        wait_for(lambda: len(records(run)) >= 1, hup, "step 1")
        hup.send_signal(signal.SIGHUP)
        hup.wait(timeout=120)
    finally:
        if hup.poll() is None:
            hup.kill()
    assert hup.returncode == EXIT_PREEMPTED, explain(hup, run)
    assert "stopped by SIGHUP; checkpoint saved at step 2" in " ".join(output(hup)[1].split())
    assert (run / "checkpoints" / "step2" / ".metadata.json").is_file()

    # A changed model shape on resume: refused with the differing keys, plan.yaml untouched.
    plan_before = (run / "plan.yaml").read_bytes()
    changed = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *steps, "model.d_model=128", env=cache)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    message = " ".join(changed.stderr.split())
    assert "trainer.resume: the checkpoint at step 2" in message and "model.d_model: 64 -> 128" in message
    assert "trainer.resume=false" in message and "Traceback" not in changed.stderr
    assert (run / "plan.yaml").read_bytes() == plan_before and not (run / LOCK_FILE).exists()
    # The plan itself refuses it, so --dry-run says so too.
    planned = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *steps, "model.d_model=128", "--dry-run", env=cache)
    assert planned.returncode == 2 and "model.d_model: 64 -> 128" in " ".join(planned.stderr.split())

    # trainer.resume=false moves the checkpoints aside and says where; olmx jobs cancel stops it.
    fresh = start(run, cache, *steps, "trainer.resume=false", faults="hold@1:0")
    try:
        wait_for(lambda: events(run, "fresh") and len(events(run, "start")) == 2, fresh, "the fresh start")
        cancel = olmx_cli("jobs", "cancel", str(run))
        assert cancel.returncode == 0, cancel.stderr
        fresh.wait(timeout=120)
    finally:
        if fresh.poll() is None:
            fresh.kill()
    assert fresh.returncode == EXIT_PREEMPTED, explain(fresh, run)
    [old] = run.glob("checkpoints.old-*")
    assert events(run, "fresh")[0]["moved_to"] == str(old)
    assert (old / "step2" / ".metadata.json").is_file()  # moved, not deleted
    assert (run / "checkpoints" / "step1" / ".metadata.json").is_file()
    out, err = output(fresh)
    assert f"are moved aside to {run}/checkpoints.old-<time>/" in " ".join(out.split())
    assert f"the earlier checkpoints were moved to {old}" in " ".join(err.split())

    # olmx report R --compare A B: several paths after one --compare; R's own report stays.
    from typer.testing import CliRunner

    from olmx.cli import app

    for name in ("a", "b"):
        shutil.copytree(run, tmp_path / name)
    cli = CliRunner()
    own = cli.invoke(app, ["report", str(run)])
    assert own.exit_code == 0, own.output
    own_plot = (run / "report" / "loss.png").read_bytes()
    both = cli.invoke(app, ["report", str(run), "--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert both.exit_code == 0, both.output
    assert f"report written to {run / 'report' / 'compare'}" in both.output
    header = (run / "report" / "compare" / "summary.txt").read_text().splitlines()[2]
    assert [cell.strip() for cell in header.split("┃")][2:5] == ["run", "a", "b"], header
    assert (run / "report" / "loss.png").read_bytes() == own_plot
    missing_flag = cli.invoke(app, ["report", str(run), str(tmp_path / "a")])
    assert missing_flag.exit_code == 2 and "add --compare" in missing_flag.output


def test_a_working_directory_holding_an_olmx_folder_trains(tmp_path, cache):
    """Workers run ``python -m olmx``: the working directory must not shadow the installed olmx."""
    project = tmp_path / "project"
    (project / "olmx").mkdir(parents=True)
    (project / "olmx" / "notes.txt").write_text("a folder of the user's that happens to be called olmx\n")
    console_script = Path(sys.executable).parent / "olmx"
    proc = start(project / "runs" / "a", cache, *ONE, "trainer.max_steps=2", cmd=[str(console_script)], cwd=project)
    proc.wait(timeout=300)
    run = project / "runs" / "a"
    assert proc.returncode == 0, explain(proc, run)
    assert [r["step"] for r in records(run)] == [1, 2]
    # The trap is real: a plain ``python -m olmx`` from there imports the folder instead.
    trap = olmx_cli("--version", cwd=project)
    assert trap.returncode == 1 and "cannot import name '__version__' from 'olmx'" in trap.stderr
    dry = subprocess.run([str(console_script), "train", "--dry-run", *ONE], cwd=project, capture_output=True, text=True)
    assert "PYTHONSAFEPATH=1" in dry.stdout
    assert "step 2/2 (100%)" in output(proc)[1]


def test_foreign_folders_and_missing_credentials_are_refused_before_anything_is_written(tmp_path, cache):
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "thesis.tex").write_text("\\section{Results}\n")
    (mine / "checkpoints" / "keep.pt").write_text("not olmx's")
    (mine / "metrics.jsonl").write_text("my own numbers\n")
    before = tree(mine)
    for extra in ([], ["trainer.resume=false"]):
        proc = olmx_cli("train", *SMALL, *ONE, f"trainer.run_dir={mine}", *extra, env=cache)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: trainer.run_dir: ")
        assert f"'{mine}' is a non-empty folder that olmx did not create" in proc.stderr
        assert tree(mine) == before

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RUNPOD_API_KEY"}
    env.update(cache, HOME=str(home), OLMO_DISABLE_PER_RANK_TRITON_CACHE="1")
    pod = tmp_path / "pod"
    args = ["train", "infra=runpod", "infra.gpus_per_node=0", f"trainer.run_dir={pod}"]
    proc = subprocess.run([*OLMX, *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: infra=runpod: no RunPod API key: set RUNPOD_API_KEY" in " ".join(proc.stderr.split())
    assert not pod.exists()
    dry = subprocess.run([*OLMX, *args, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert not pod.exists()


def test_lock_stale_foreign_and_racing_takeovers(tmp_path):
    rd = RunDir(tmp_path / "run")
    lock = rd.acquire()
    assert lock.took_over is None and os.environ[LOCK_ENV] == lock.holder.token
    held = json.loads(rd.lock_file.read_text())
    assert (held["host"], held["pid"]) == (HOST, os.getpid()) and held["started"]
    with pytest.raises(ConfigError, match=f"in use by olmx train \\(pid {os.getpid()} on host {HOST}"):
        rd.acquire()
    lock.release()
    assert not rd.lock_file.exists() and LOCK_ENV not in os.environ

    def plant(**fields) -> Holder:
        holder = Holder(**{**vars(Holder.current()), **fields})
        rd.lock_file.write_text(json.dumps(vars(holder)))
        return holder

    stale = plant(pid=_dead_pid(), pid_start=None)
    lock = rd.acquire()
    assert lock.took_over == stale and RunDir(rd.path).lock_holder() == lock.holder
    lock.release()

    # The launcher is gone but a process it started (torchrun saving a checkpoint) still runs.
    orphan = plant(pid=_dead_pid(), token="t-orphan")
    # Popen returns once the child's exec has begun, before the kernel has set up its
    # environment (/proc/PID/environ reads empty until then): wait for the child to say so.
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        env={**os.environ, LOCK_ENV: orphan.token},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        with pytest.raises(ConfigError, match=f"which is gone; processes it started still run \\(pids {child.pid}"):
            rd.acquire()
    finally:
        child.kill()
        child.wait()
    assert rd.acquire().took_over == orphan
    rd.lock_file.unlink()

    plant(host="node-7", pid=12345)
    with pytest.raises(ConfigError, match=f"on another host .* remove {rd.lock_file} and run again"):
        rd.acquire()
    # A lock from before a reboot of this host is stale, whatever its pid.
    plant(pid=1, boot_id="an-earlier-boot")
    rd.acquire().release()

    # Several launchers find the same stale lock at once: exactly one takes it.
    racer = (
        "import sys, time\n"
        "from olmx.errors import ConfigError\n"
        "from olmx.rundir import RunDir\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "try:\n"
        "    RunDir(sys.argv[1]).acquire()\n"
        "    print('took'); time.sleep(1.5)\n"
        "except ConfigError as e:\n"
        "    print('refused', e)\n"
    )
    for _ in range(3):
        plant(pid=_dead_pid())
        at = str(time.time() + 1.0)
        procs = [
            subprocess.Popen([sys.executable, "-c", racer, str(rd.path), at], stdout=subprocess.PIPE, text=True)
            for _ in range(6)
        ]
        outcomes = [p.communicate(timeout=60)[0] for p in procs]
        assert sum(o.startswith("took") for o in outcomes) == 1, outcomes
        assert all(o.startswith(("took", "refused")) for o in outcomes), outcomes
    assert not (rd.path / MARKER_FILE).exists()  # the lock alone does not claim the folder


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_failure_quotes_the_exception_not_a_warning(tmp_path):
    from olmx.launch.failures import attempt_failures, log_excerpt

    rank = tmp_path / "run" / "attempt_0" / "0"
    rank.mkdir(parents=True)
    (rank / "stderr.log").write_text("W1201 some_module.py:12] UserWarning: an unrelated deprecation\n" * 3)
    (rank / "stdout.log").write_text(
        "step 1 ok\n"
        "Traceback (most recent call last):\n"
        '  File "olmx/worker/run.py", line 60, in _run\n'
        "    build()\n"
        "ValueError: data.seq_len=64 is longer than the shortest document\n"
        "olmx: more output after the error\n"
    )
    console = "[E] failed (exitcode: 1) local_rank: 0 (pid: 11) of binary: python\n"
    [failure] = attempt_failures(console, tmp_path / "run")
    assert failure.log == str(rank / "stdout.log")
    assert failure.tail.splitlines()[0] == "Traceback (most recent call last):"
    assert failure.tail.splitlines()[-1] == "ValueError: data.seq_len=64 is longer than the shortest document"
    assert "UserWarning" not in failure.tail

    node_log = tmp_path / "node0.log"
    node_log.write_text(
        "[rank0]:Traceback (most recent call last):\n"
        '[rank0]:  File "x.py", line 1, in <module>\n'
        "[rank1]:W an interleaved warning of another rank\n"
        "[rank0]:RuntimeError: boom\n"
        "torchrun: a warning after the error\n"
    )
    assert log_excerpt(node_log).splitlines() == [
        "[rank0]:Traceback (most recent call last):",
        '[rank0]:  File "x.py", line 1, in <module>',
        "[rank0]:RuntimeError: boom",
    ]
