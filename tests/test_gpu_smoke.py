"""benchmarks/gpu/smoke.sh, as far as a CPU allows: it stops at once, with the reason, where
there is no GPU, and every run it would start plans for an H200 (``--plan-only``)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from tests.conftest import REPO


def test_smoke_script_refuses_without_a_gpu():
    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real thing
        return
    proc = subprocess.run(
        ["bash", "benchmarks/gpu/smoke.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert proc.returncode == 3
    assert "no CUDA GPU visible" in proc.stderr


def test_every_smoke_run_plans_for_an_h200(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu/smoke.py", "--plan-only", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads((tmp_path / "smoke.json").read_text())
    ran = {r["step"]: r for r in records}
    assert ran["mxfp8"]["skipped"] == "needs compute capability 10.0"  # an H200 is SM90
    assert all(r["exit"] == 0 for r in records if "exit" in r)
    assert len([r for r in records if "exit" in r]) == 8
    assert "GPU smoke" in (tmp_path / "RESULTS.md").read_text()
