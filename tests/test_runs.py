"""``olmx runs``: the runs under a root at a glance, read from their run directories: a real
finished run (the session's reference run) beside runs left in each other state by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from olmx.events import append_event
from olmx.rundir import CHECKPOINT_MARK, RunDir
from tests.conftest import olmx_cli


def _run(root: Path, name: str, *, max_steps: int = 10, steps: int = 0, plan: str | None = None) -> Path:
    path = root / name
    (path / "checkpoints").mkdir(parents=True)
    saved = f"config:\n  trainer:\n    max_steps: {max_steps}\nolmx_version: 0.1.0\n"  # a plan file ends so
    (path / "plan.yaml").write_text(plan if plan is not None else saved)
    lines = [json.dumps({"step": s, "loss": 5.0 - s / 10, "tokens": 512 * s}) for s in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    return path


def _checkpoint(run: Path, step: int, *, complete: bool) -> None:
    (run / "checkpoints" / f"step{step}").mkdir()
    if complete:
        (run / "checkpoints" / f"step{step}" / CHECKPOINT_MARK).write_text("{}")


def test_each_state_in_one_line_and_as_json(tmp_path, reference_run):
    root = tmp_path / "runs"
    shutil.copytree(reference_run, root / "a-finished")
    stopped = _run(root, "b-stopped", steps=3)
    append_event(stopped, "start", attempt=0, resumed_from=None)
    append_event(stopped, "end", reason="SIGTERM", step=3)
    _checkpoint(stopped, 2, complete=True)
    _checkpoint(stopped, 3, complete=False)  # never published: not the last checkpoint
    with open(stopped / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # a line cut by a kill
    failed = _run(root, "c-failed", steps=1)
    append_event(failed, "start", attempt=0, resumed_from=None)
    append_event(failed, "rank_failed", node_rank=0, local_rank=1, cause="raised ValueError: bad")
    _run(root, "d-planned", plan="config: [cut")
    running = _run(root, "e-running", steps=2)
    append_event(running, "start", attempt=0, resumed_from=None)
    (root / "not-a-run").mkdir()
    lock = RunDir(running).acquire()
    try:
        listed = olmx_cli("runs", str(root), "--json")
        table = olmx_cli("runs", str(root), env={"COLUMNS": "80"})  # a pipe: COLUMNS does not cut it
    finally:
        lock.release()
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert list(rows) == ["a-finished", "b-stopped", "c-failed", "d-planned", "e-running"]
    got = {n: (r["state"], r["step"], r["max_steps"], r["checkpoint"]) for n, r in rows.items()}
    assert got == {
        "a-finished": ("finished", 12, 12, 12),
        "b-stopped": ("stopped", 3, 10, 2),
        "c-failed": ("failed", 1, 10, None),
        "d-planned": ("not started", 0, None, None),
        "e-running": ("running", 2, 10, None),
    }
    assert rows["a-finished"]["tokens"] == 12 * 8 * 64 and rows["a-finished"]["loss"] < 5.5
    assert rows["b-stopped"]["detail"] == "stopped by SIGTERM; checkpoint saved at step 3"
    assert rows["c-failed"]["detail"] == "node 0 local rank 1 raised ValueError: bad"
    assert rows["e-running"]["detail"].startswith("olmx train (pid ")
    assert rows["b-stopped"]["loss"] == 4.7 and rows["b-stopped"]["tokens"] == 1536

    assert table.returncode == 0, table.stderr
    # written to a pipe: the title names the root folder whole, and each run is one line
    title, *lines = table.stdout.splitlines()
    assert title == f"olmx runs in {root}", table.stdout
    for name, row in rows.items():
        assert len([line for line in lines if f" {name} " in line and row["state"] in line]) == 1, table.stdout
    assert any(rows["e-running"]["detail"] in line for line in lines), table.stdout  # not cut
    assert "12/12" in table.stdout and "?" in table.stdout  # the cut plan's max_steps

    missing = olmx_cli("runs", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: ROOT: ")


def test_a_lock_file_of_binary_garbage_is_an_unknown_state_not_a_traceback(tmp_path):
    """A lock file that is no text (was a UnicodeDecodeError traceback of olmx runs): its run is
    listed as unknown, naming the file, and olmx train takes the file over."""
    root = tmp_path / "runs"
    run = _run(root, "garbled", steps=1)
    (run / ".olmx-lock").write_bytes(b"\xff\xfe\x00garbage\x9c")
    listed = olmx_cli("runs", str(root), "--json")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["state"] == "unknown"
    assert row["detail"] == (
        f"unreadable lock file {run / '.olmx-lock'} (not one olmx wrote); the next olmx train takes it over"
    )
    lock = RunDir(run).acquire()
    try:
        assert lock.took_over is not None and lock.took_over.unreadable
    finally:
        lock.release()
    assert not (run / ".olmx-lock").exists()


def test_the_checkpoint_mark_is_olmo_cores():
    from olmo_core.train.checkpoint import Checkpointer

    assert CHECKPOINT_MARK == Checkpointer.METADATA_FNAME
