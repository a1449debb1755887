"""``infra=local`` across "nodes", and training with Beaker and Gantry unimportable.

* Two ``olmx train infra.nnodes=2 infra.node_rank=R infra.nproc_per_node=1`` invocations on
  this machine (the same run directory, as on a shared filesystem) meet in torchrun's c10d
  rendezvous and train the same loss curve as one invocation with 2 processes.
* The reference run has ``beaker`` and ``gantry`` blocked in every process (launcher,
  torchrun agent, workers: ``blocker/sitecustomize.py`` on PYTHONPATH): training works, no
  process has either loaded, and none connected to an address outside this machine. The only
  import attempt is ``cached_path`` probing for ``beaker`` (inside try/except ImportError) when
  OLMo-core imports it; olmx and OLMo-core themselves never try.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import OLMX, olmx_cli
from tests.test_training import SMALL

pytestmark = pytest.mark.dist
BLOCKER = Path(__file__).resolve().parent / "blocker"
STEPS = ["trainer.max_steps=4", "trainer.save_interval=100"]
#: cached_path (a dependency of OLMo-core) probes for beaker-py at import, inside try/except.
CACHED_PATH_PROBE = str(Path(__import__("cached_path").__file__).parent / "schemes" / "__init__.py")


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> dict[str, str]:
    return {"OLMX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> tuple[Path, str]:
    """One node, 2 processes, with the blocker: (run dir, blocker log)."""
    root = tmp_path_factory.mktemp("reference")
    log = root / "blocker.log"
    env = {
        **cache,
        "OLMX_BLOCKER_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BLOCKER), os.environ.get("PYTHONPATH")])),
    }
    proc = olmx_cli("train", *SMALL, *STEPS, "infra.nproc_per_node=2", f"trainer.run_dir={root / 'run'}", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "run", log.read_text()


def test_training_needs_neither_beaker_nor_gantry(reference) -> None:
    run_dir, log = reference
    assert len(losses(run_dir)) == 4  # it trained
    lines = log.splitlines()
    active = [line for line in lines if line.startswith("active ")]
    # (sys.argv as seen at startup: "-m" still stands for the module's name)
    assert sum(" -m train " in line for line in active) == 1  # the launcher: olmx train
    assert sum("--nproc-per-node=2" in line for line in active) == 1  # the torchrun agent
    assert sum(" -m run " in line for line in active) == 2  # the workers: olmx run plan.yaml
    attempts = [line.split(" ", 2)[2] for line in lines if line.startswith("import ")]
    assert attempts and all(
        a in (f"beaker from {CACHED_PATH_PROBE}", f"beaker.version from {CACHED_PATH_PROBE}") for a in attempts
    ), attempts
    assert [line for line in lines if line.startswith("loaded ")] == []
    assert [line for line in lines if line.startswith("connect ")] == []


def test_blocker_would_see_an_import(tmp_path) -> None:
    """The check above can fail: an import of beaker in a process with the blocker is recorded."""
    log = tmp_path / "blocker.log"
    env = {**os.environ, "OLMX_BLOCKER_LOG": str(log), "PYTHONPATH": str(BLOCKER)}
    code = "try:\n    import gantry.api\nexcept ImportError as e:\n    print(e)\n"
    proc = subprocess.run([OLMX[0], "-c", code], env=env, capture_output=True, text=True)
    assert "gantry is blocked" in proc.stdout
    assert any(
        line.startswith("import ") and line.endswith(" gantry from <string>") for line in log.read_text().splitlines()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_by_hand_match_one_node(tmp_path, reference, cache) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    env = {**os.environ, "OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1", "COLUMNS": "200", **cache}
    procs = [
        subprocess.Popen(
            [
                *OLMX,
                "train",
                *SMALL,
                *STEPS,
                "infra.nnodes=2",
                f"infra.node_rank={rank}",
                "infra.nproc_per_node=1",
                "infra.master_addr=127.0.0.1",
                f"infra.master_port={port}",
                f"trainer.run_dir={run_dir}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    # The same loss curve as 1 node x 2 processes (same global batch, same data order).
    assert losses(run_dir) == pytest.approx(losses(reference[0]), rel=2e-5)
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert "2 processes = 2 node(s) x 1" in out
        # Each invocation ends as the run did, whichever of them got global rank 0 (the c10d
        # rendezvous hands out ranks in arrival order, not by infra.node_rank).
        assert p.returncode == 0, f"node_rank={rank}: " + err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(p["rank"] for p in summary["processes"]) == [0, 1]
    assert (run_dir / "logs" / "node0.log").exists() and (run_dir / "logs" / "node1.log").exists()
    # Both invocations wrote plan.yaml into the shared run directory; the plans differ only in
    # infra.node_rank, which the workers do not read.
    import yaml

    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    assert plan["config"]["infra"]["node_rank"] in (0, 1) and plan["world"]["nnodes"] == 2
