"""``olmx report`` on real runs: one that finished, one whose rank was killed with no restarts
left (``olmx train`` must name that rank and show its log), and both overlaid."""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path

import pytest
import yaml

from olmx.report import PLOTS, load_run, peak_flops, summarize, write_report
from tests.conftest import olmx_cli
from tests.test_training import SMALL

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    env = {"OLMX_CACHE_DIR": str(root / "cache")}
    finished = olmx_cli(
        "train",
        *SMALL,
        "trainer.report=true",
        f"trainer.run_dir={root / 'finished'}",
        "trainer.max_steps=6",
        "infra.nproc_per_node=1",
        "parallel=[]",
        env=env,
    )
    assert finished.returncode == 0, finished.stderr
    # olmx train writes the report when the run ends, and says where.
    assert f"report: {root / 'finished' / 'report'} (again any time: olmx report" in " ".join(finished.stdout.split())
    assert {p.name for p in (root / "finished" / "report").iterdir()} == {f"{n}.png" for n in PLOTS} | {"summary.txt"}
    crashed = olmx_cli(
        "train",
        *SMALL,
        "trainer.report=true",
        f"trainer.run_dir={root / 'crashed'}",
        "trainer.max_steps=6",
        "infra.max_restarts=0",
        env={**env, "OLMX_FAULTS": "kill@3:1"},
    )
    for p in (root / "finished" / "report", root / "crashed" / "report"):
        shutil.rmtree(p)  # the tests below check what olmx report writes
    return root / "finished", root / "crashed", crashed


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature; the image decodes."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    assert matplotlib.image.imread(path).shape[:2] == (height, width)
    return width, height


def test_report_of_a_finished_run(runs):
    finished, _, _ = runs
    proc = olmx_cli("report", str(finished))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for row in (
        "status",
        "config digest",
        "steps",
        "tokens",
        "loss first / last / best",
        "tokens/s per device",
        "MFU",
        "peak memory (MiB)",
        "restarts",
        "non-finite steps",
    ):
        assert row in out
    assert "finished" in out and "6 / 6" in out and f"{6 * 8 * 64:,}" in out
    for name in PLOTS:
        assert png_size(finished / "report" / f"{name}.png") == (800, 450)
    assert "config digest" in (finished / "report" / "summary.txt").read_text()


def test_killed_rank_without_restarts_is_named_and_reported(runs):
    _, crashed, proc = runs
    assert proc.returncode == 1
    assert f"report: {crashed / 'report'}" in " ".join(proc.stdout.split())  # also after a failure
    assert "node 0 local rank 1 (attempt 0): " in proc.stderr and "SIGKILL" in proc.stderr
    assert "no restarts left (infra.max_restarts=0)" in proc.stderr
    assert "attempt_0/1/stderr.log" in proc.stderr  # where the dead rank's log is
    [failed] = [
        json.loads(line) for line in (crashed / "events.jsonl").read_text().splitlines() if '"rank_failed"' in line
    ]
    assert failed["local_rank"] == 1 and failed["exitcode"] == -9
    report = olmx_cli("report", str(crashed))
    assert report.returncode == 0, report.stderr
    assert "failed (node 0 local rank 1: killed by SIGKILL" in " ".join(report.stdout.split())
    for name in PLOTS:
        assert png_size(crashed / "report" / f"{name}.png") == (800, 450)


def test_compare_overlays_runs_and_mfu_uses_the_device_peak(runs, tmp_path):
    finished, crashed, _ = runs
    console_out = io.StringIO()
    from rich.console import Console

    out_dir = write_report(finished, compare=[crashed], console=Console(file=console_out, width=200))
    assert out_dir == finished / "report" / "compare"  # the run's own report/ stays as it was
    text = (out_dir / "summary.txt").read_text()
    assert "finished" in text and "crashed" in text
    assert png_size(out_dir / "loss.png") == (800, 450)

    # The same records on a known GPU in bf16: MFU is the median measured FLOP/s over its peak.
    gpu = tmp_path / "gpu"
    shutil.copytree(finished, gpu)
    plan = yaml.safe_load((gpu / "plan.yaml").read_text())
    plan["world"]["device_name"] = "NVIDIA H100 80GB HBM3"
    plan["config"]["precision"] = {"name": "bf16"}
    plan["dtypes"] = {"param": "bfloat16", "reduce": "float32"}
    (gpu / "plan.yaml").write_text(yaml.safe_dump(plan))
    run = load_run(gpu)
    flops = sorted(r["flops_per_s_per_device"] for r in run.records if r.get("flops_per_s_per_device"))
    assert flops, "OLMo-core's FLOP/s reached metrics.jsonl"
    import statistics

    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12 and peak_flops("cpu", "float32") is None
    assert summarize(run)["MFU"] == f"{100 * statistics.median(flops) / 989e12:.3g}%"
    assert summarize(load_run(finished))["MFU"].startswith("- (peak of 'cpu'")


def test_a_cut_or_hand_broken_plan_is_one_plan_line(tmp_path):
    """``olmx report`` reads plan.yaml through Plan.load, the guarded reader ``olmx run`` uses:
    a file cut short, or one whose values break their fields' rules, is one line, exit 2."""
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    plan = plan_from_overrides([f"trainer.run_dir={tmp_path / 'run'}"], registry())
    path = plan.save()
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    cut = olmx_cli("report", str(tmp_path / "run"))
    assert cut.returncode == 2 and cut.stderr.count("\n") == 1, cut.stderr
    assert "PLAN: " in cut.stderr and ("truncated" in cut.stderr or "not valid YAML" in cut.stderr), cut.stderr
    data = yaml.safe_load(text)
    data["config"]["model"]["d_model"] = -4
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    edited = olmx_cli("report", str(tmp_path / "run"))
    assert edited.returncode == 2, edited.stderr
    assert "config.model.d_model: must be a positive integer, got -4" in edited.stderr
