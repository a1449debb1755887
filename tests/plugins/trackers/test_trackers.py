"""Trackers (``trackers=[...]``): real training runs through the real CLI, read back with the
trackers' own file formats.

* one vocabulary (:mod:`olmx.metrics`): TensorBoard's, MLflow's and W&B's metric names are
  ``metrics.jsonl``'s (MLflow's after its one substitution), with the same values;
* tensorboard: the event files hold every step's training loss equal to ``metrics.jsonl``'s,
  the config and the plan as text; a resume after a lost checkpoint shows each step once;
* a third-party tracker registered through an entry point records the same metrics, on rank 0
  only; a broken one is a row in ``olmx plugins list``;
* wandb offline: its offline run holds the metrics and the config, no key is needed, and no
  connection is made (a local listener stands in for the W&B server and every proxy);
  online without a key is refused by the plan (exit 2);
* mlflow: the run in RUN_DIR/mlflow.db (SQLite), read back with MLflow 3's own client as the
  README prints it (no MLFLOW_ALLOW_FILE_STORE), holds every step's loss, the config as
  parameters and the config and plan as files in RUN_DIR/mlartifacts; ``mlflow server`` on it
  serves the run on loopback; a resume continues the same MLflow run; no connection is made; a
  tracking URI with credentials, a file store or another kind is refused by the plan.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import threading
from pathlib import Path

import pytest

from olmx.metrics import mlflow_name
from tests.conftest import make_dist, olmx_cli
from tests.test_cli import modules_after
from tests.test_training import SMALL, train

pytestmark = pytest.mark.dist

#: A third-party tracker (an MLflow/Comet stand-in): one JSON line per logged step, per rank
#: that records, into ``RUN_DIR/<dir>/rank<R>.jsonl``.
JSONL_TRACKER = """
    '''jsonl: every metric as JSON lines (a third-party tracker).'''
    import os
    from dataclasses import dataclass
    from pathlib import Path
    from olmx.api import Contribution, TrackerPlugin

    @dataclass
    class JsonlConfig:
        #: folder inside the run directory
        dir: str = "jsonl"

    class Jsonl(TrackerPlugin):
        name = "jsonl"
        description = "every metric as JSON lines"
        api = ">=3.0,<4"
        Config = JsonlConfig

        def resolve(self, cfg, ctx):
            return Contribution(rows=[("writes", f"offline: RUN_DIR/{cfg.dir}")])

        def callbacks(self, cfg, plan):
            import json
            from olmo_core.train.callbacks import Callback

            path = Path(plan.run_dir) / cfg.dir / f"rank{os.environ.get('RANK', '0')}.jsonl"

            class Lines(Callback):
                def pre_train(self):
                    path.parent.mkdir(parents=True, exist_ok=True)

                def log_metrics(self, step, metrics):
                    with open(path, "a") as f:
                        f.write(json.dumps({"step": step, **metrics}) + "\\n")

            return {"jsonl": Lines()}

    JSONL = Jsonl()
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one scalar as TensorBoard shows it (its reader, purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def texts(log_dir: Path, tag: str) -> list[tuple[int, str]]:
    """``(step, text)`` of one ``add_text`` tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(f"{tag}/text_summary")]


def loss_by_step(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["loss"] is not None}  # not eval records


@pytest.fixture
def network_trap(monkeypatch):
    """A local listener that every HTTP(S) proxy variable points at: the requests it received."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    requests: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            requests.append(conn.recv(200))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "WANDB_BASE_URL"):
        monkeypatch.setenv(name, url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "")
    yield requests
    server.close()


def mlflow_client(run_dir: Path):
    """MLflow's client on the run's store, as the README prints it."""
    import os

    from mlflow import MlflowClient

    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # no opt-out of MLflow 3's file-store refusal
    return MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")


def mlflow_history(run_dir: Path, metric: str) -> tuple[list, dict[int, list[float]]]:
    """The MLflow runs in ``RUN_DIR/mlflow.db`` (MLflow's client) and one metric's points by
    step, in the order logged."""
    client = mlflow_client(run_dir)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    points: dict[int, list[float]] = {}
    for m in sorted(client.get_metric_history(runs[0].info.run_id, metric), key=lambda m: m.timestamp):
        points.setdefault(m.step, []).append(m.value)
    return runs, points


def mlflow_ui_run(run_dir: Path, run_id: str) -> dict:
    """The run as ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`` serves it (its REST
    API on a loopback port; the server is stopped, with every process it started, before this returns)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow), "ui", "--backend-store-uri", f"sqlite:///{run_dir}/mlflow.db", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    server = subprocess.Popen(cmd, env=env, start_new_session=True, **quiet)
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={run_id}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with opener.open(url, timeout=5) as response:
                    return json.loads(response.read())["run"]
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow ui did not serve the run"
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def jsonl_metrics(run_dir: Path) -> dict[str, dict[int, float]]:
    """``metrics.jsonl``'s metrics: name -> step -> value (``step``, ``time``, ``skipped`` and
    nulls left out: what a tracker records)."""
    out: dict[str, dict[int, float]] = {}
    for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        for k, v in r.items():
            if k not in ("step", "time", "skipped") and v is not None:
                out.setdefault(k, {})[r["step"]] = v
    return out


def tensorboard_metrics(log_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the event files: tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def same_metrics(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]], rename=lambda n: n) -> None:
    """``got`` (a tracker's) has exactly ``want``'s names (metrics.jsonl's, renamed) and values."""
    assert sorted(got) == sorted(rename(n) for n in want)
    for name, points in want.items():
        recorded = got[rename(name)]
        assert {s: recorded[s] for s in points} == pytest.approx(points, rel=1e-6, abs=1e-6), name


def test_tensorboard_mlflow_and_a_third_party_tracker_record_the_training_loss(
    tmp_path, cache, plugin_site, network_trap
):
    entry_points = "[olmx.trackers]\njsonl = jsonl_tracker:JSONL\n"
    make_dist(plugin_site, "olmx-jsonl", entry_points, {"jsonl_tracker": JSONL_TRACKER})
    run_dir = tmp_path / "run"
    steps = ["trainer.max_steps=4", "trainer.save_interval=2", "trackers=[tensorboard,jsonl,mlflow]"]
    steps += ["trackers.mlflow.tags={team: nlp}"]
    train(run_dir, cache, *steps)
    tb = run_dir / "tensorboard"
    want = loss_by_step(run_dir)
    assert sorted(want) == [1, 2, 3, 4]
    assert scalars(tb, "loss") == [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(want.items())]
    assert [s for s, _ in scalars(tb, "lr")] == [1, 2, 3, 4]
    # One vocabulary: TensorBoard and MLflow record metrics.jsonl's names and values.
    logged = jsonl_metrics(run_dir)
    assert {"loss", "lr", "eval/loss", "eval/perplexity", "tokens", "peak_mem_mib", "optim/total grad norm"} <= set(
        logged
    )
    same_metrics(tensorboard_metrics(tb), logged)
    # One held-out loss: trackers get the number metrics.jsonl and the progress line show
    # (they got OLMo-core's, (seq_len - 1) / seq_len of it; tests/worker/test_eval.py checks the value
    # against a one-process evaluation of the checkpoint).
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    held = {r["step"]: r["eval/loss"] for r in map(json.loads, lines) if "eval/loss" in r}
    assert sorted(held) == [4]
    assert scalars(tb, "eval/loss") == [(4, pytest.approx(held[4], rel=1e-6))]
    [(step, config)] = texts(tb, "olmx/config")
    assert step == 0 and "trackers:\n      tensorboard:" in config and "max_steps: 4" in config
    [(_, plan)] = texts(tb, "olmx/plan")
    assert "| world | 2 processes" in plan and "offline: RUN_DIR/tensorboard" in plan
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1  # rank 0 only

    # The third-party tracker: every metric of every logged step, from rank 0 only.
    assert sorted(p.name for p in (run_dir / "jsonl").iterdir()) == ["rank0.jsonl"]
    records = [json.loads(line) for line in (run_dir / "jsonl" / "rank0.jsonl").read_text().splitlines()]
    assert {r["step"]: r["train/CE loss"] for r in records if "train/CE loss" in r} == want
    assert all("optim/LR (group 0)" in r for r in records if "train/CE loss" in r)

    # MLflow: one run in RUN_DIR/mlflow.db, read back with MLflow's own client.
    [run], points = mlflow_history(run_dir, "loss")
    assert {s: v for s, (v,) in points.items()} == pytest.approx(want, rel=1e-6)
    assert (run.info.run_name, run.info.status, run.data.tags["team"]) == ("run", "FINISHED", "nlp")
    assert run.data.params["trainer.max_steps"] == "4" and run.data.params["trackers.mlflow.experiment"] == "olmx"
    client = mlflow_client(run_dir)
    recorded = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)} for k in run.data.metrics}
    same_metrics(recorded, logged, rename=mlflow_name)
    assert run.data.metrics["eval/loss"] == pytest.approx(held[4], rel=1e-6)
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(run_dir / "mlartifacts")
    served = mlflow_ui_run(run_dir, run.info.run_id)  # `mlflow ui` on the store, as the README says
    assert served["info"]["run_name"] == "run" and any(m["key"] == "loss" for m in served["data"]["metrics"])
    assert "max_steps: 4" in (artifacts / "olmx" / "config.yaml").read_text()
    assert "| world | 2 processes" in (artifacts / "olmx" / "plan.md").read_text()

    # A resume after the last checkpoint was lost: steps 3-4 are trained again from step 2.
    # TensorBoard shows each step once, the second attempt's values (metrics.jsonl's).
    shutil.rmtree(run_dir / "checkpoints" / "step4")
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={run_dir}", *steps, env=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Resuming from the checkpoint at step 2" in proc.stdout
    again = loss_by_step(run_dir)
    assert sorted(again) == [1, 2, 3, 4]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2  # a new file; the first one is kept
    assert scalars(tb, "loss") == [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(again.items())]
    assert [s for s, _ in texts(tb, "olmx/plan")] == [0, 2]  # each attempt's plan, at its start
    # MLflow: the same run, continued; steps 3-4 logged by both attempts, the resumed one last
    [resumed], points = mlflow_history(run_dir, "loss")
    assert (resumed.info.run_id, resumed.info.status) == (run.info.run_id, "FINISHED")
    assert [len(points[s]) for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert {s: v[-1] for s, v in points.items()} == pytest.approx(again, rel=1e-6)
    assert network_trap == []  # nothing was sent anywhere


def test_a_broken_tracker_is_a_row_not_a_crash(plugin_site):
    make_dist(
        plugin_site,
        "olmx-badtrack",
        "[olmx.trackers]\nbad = bad_tracker:BAD\nnohook = nohook_tracker:NOHOOK\n",
        {
            "bad_tracker": "raise RuntimeError('boom at import')\n",
            "nohook_tracker": JSONL_TRACKER.replace('name = "jsonl"', 'name = "nohook"')
            .replace("def callbacks(self, cfg, plan):", "def other(self, cfg, plan):")
            .replace("JSONL = Jsonl()", "NOHOOK = Jsonl()"),
        },
    )
    proc = olmx_cli("plugins", "list", "--json", "--check")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert (rows["bad"]["kind"], rows["bad"]["status"]) == ("tracker", "broken")
    assert "boom at import" in rows["bad"]["reason"]
    assert rows["nohook"]["status"] == "broken" and "does not implement callbacks" in rows["nohook"]["reason"]
    assert (rows["tensorboard"]["kind"], rows["tensorboard"]["status"]) == ("tracker", "ok")
    proc = olmx_cli("train", "--dry-run", "trackers=[bad]")
    assert proc.returncode == 2 and "trackers: plugin 'bad' from olmx-badtrack is broken" in proc.stderr


def test_tensorboard_folders_relative_to_the_run_or_one_per_run_in_a_shared_one():
    from olmx_plugins.trackers.tensorboard.plugin import log_dir

    assert log_dir("/runs/a", "tensorboard") == Path("/runs/a/tensorboard")
    assert log_dir("/runs/a", "/shared/tb") == Path("/shared/tb/a")  # runs never purge each other's steps


def test_planning_with_trackers_imports_none_of_their_libraries():
    mods = modules_after("train", "--dry-run", "trackers=[tensorboard,wandb,mlflow]")
    assert "olmx_plugins.trackers.mlflow.plugin" in mods  # it did plan with them
    assert not {"torch", "olmo_core", "tensorboard", "wandb", "mlflow"} & mods


def test_wandb_online_without_a_key_is_refused_by_the_plan(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    online = ["trackers=[wandb]", "trackers.wandb.mode=online"]
    proc = olmx_cli("train", *online, f"trainer.run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trackers.wandb.mode: online needs WANDB_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing written
    proc = olmx_cli("train", "--dry-run", "trackers=[wandb]", "trackers.wandb.mode=sometimes")
    assert proc.returncode == 2 and "trackers.wandb.mode: 'sometimes' is not one of offline, online" in proc.stderr
    # With a key it plans; the key is in no output and not in the plan.
    proc = olmx_cli(
        "train", "--dry-run", "trackers=[wandb]", "trackers.wandb.mode=online", env={"WANDB_API_KEY": "k-123-secret"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "online: https://api.wandb.ai" in proc.stdout
    assert "k-123-secret" not in proc.stdout + proc.stderr


def wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (``run-*.wandb``): W&B's LevelDB-style log (a 7-byte
    header, 32 KiB blocks of ``crc32, length, type`` chunks) of ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def test_wandb_offline_records_the_run_and_touches_no_network(tmp_path, cache, monkeypatch, network_trap):
    # Any HTTP(S) request wandb makes goes to the trap: it is the W&B server and every proxy.
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # no key needed
    monkeypatch.setenv("WANDB_MODE", "online")  # the config says offline, and the config wins
    run_dir = tmp_path / "run"
    train(run_dir, cache, "trainer.max_steps=3", "trackers=[wandb]", "trackers.wandb.project=p1")
    assert network_trap == []
    [run_file] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.run_group) == ("p1", "run", "run")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["config"]["trainer"]["max_steps"] == 3 and config["mesh"]["dp_replicate"] == 2
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    logged = {h["_step"]: h["loss"] for h in history if "loss" in h}
    assert logged == loss_by_step(run_dir)
    # One vocabulary: W&B's metric names and values are metrics.jsonl's.
    recorded: dict[str, dict[int, float]] = {}
    for h in history:
        for k, v in h.items():
            if not k.startswith("_"):  # W&B's own (_step, _runtime, _timestamp)
                recorded.setdefault(k, {})[h["_step"]] = v
    same_metrics(recorded, jsonl_metrics(run_dir))
    assert any(r.WhichOneof("record_type") == "exit" for r in records)  # finished


@pytest.mark.parametrize(
    ("uri", "text"),
    [
        ("https://alice:s3cret-pw@mlflow.example.com", "holds credentials"),
        ("postgresql://db.example.com/mlflow", "'postgresql:' is not a store olmx writes to"),
        ("file:/shared/mlruns", "is a file store, which MLflow 3 keeps in maintenance mode"),
        ("mlruns", "use a SQLite store, its recommended local one: sqlite:///PATH/mlflow.db"),
        ("https://", "names no host"),
        # MLflow would open the run directory itself as its store / find the folder only after launch
        ("sqlite:///", "'sqlite:///' names no SQLite file: write sqlite:///PATH/mlflow.db"),
        (
            "sqlite:////dev/null/x/mlflow.db",
            "'/dev/null/x' cannot be created: '/dev/null' is not a directory (MLflow writes the store "
            "/dev/null/x/mlflow.db there)",
        ),
    ],
)
def test_mlflow_tracking_uris_that_cannot_work_are_refused_by_the_plan(tmp_path, uri, text):
    where = [f"trackers.mlflow.tracking_uri={uri}", f"trainer.run_dir={tmp_path / 'r'}"]
    proc = olmx_cli("train", "trackers=[mlflow]", *where)
    assert proc.returncode == 2 and "trackers.mlflow.tracking_uri: " in proc.stderr, proc.stderr
    assert text in proc.stderr and "Traceback" not in proc.stderr and "s3cret-pw" not in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()  # nothing written


def test_mlflow_stores_are_absolute_sqlite_files_or_the_server():
    from olmx_plugins.trackers.mlflow.plugin import artifact_location, store_uri

    assert store_uri("/runs/a", None) == "sqlite:////runs/a/mlflow.db"
    assert store_uri("/runs/a", "sqlite:////shared/mlflow.db") == "sqlite:////shared/mlflow.db"
    assert store_uri("/runs/a", "sqlite:///elsewhere.db") == "sqlite:////runs/a/elsewhere.db"
    assert store_uri("/runs/a", "https://mlflow.example.com") == "https://mlflow.example.com"
    assert artifact_location("sqlite:////runs/a/mlflow.db") == "file:///runs/a/mlartifacts"
    assert artifact_location("https://mlflow.example.com") == ""


def test_one_metric_vocabulary_and_mlflows_one_substitution():
    from olmx.metrics import canonical, mlflow_name

    trainer = {"train/CE loss": 2.5, "optim/LR (group 0)": 1e-3, "eval/lm/heldout/CE loss": 3.0, "flag": True}
    trainer |= {"eval/downstream/copa (accuracy)": 0.5, "train/Z loss": 0.1}
    assert canonical(trainer) == {
        "loss": 2.5,
        "lr": 1e-3,
        "eval/loss": 3.0,
        "eval/downstream/copa (accuracy)": 0.5,
        "train/Z loss": 0.1,
    }
    assert mlflow_name("eval/downstream/copa (accuracy)") == "eval/downstream/copa _accuracy_"
    assert mlflow_name("optim/total grad norm") == "optim/total grad norm"  # allowed as it is
