"""benchmarks/gpu/smoke.sh and wheels.sh, as far as a CPU allows.

- Without a GPU (and not rehearsing) smoke.sh stops at once with exit status 3 and the reason.
- ``--plan-only``: every run of the sequence plans for an H200.
- The install takes the wheels that fit the interpreter, and protobuf only where the
  interpreter's own is outside the range OLMo-core's import chain needs.
- The rehearsal (marked ``rehearsal``; needs PyPI, ~2-3 minutes): an interpreter set up like the
  GPU image (a fresh venv that sees torch and the image's other packages and nothing of olmx's,
  with an older protobuf than OLMo-core's import chain needs: :func:`image_like_python`; or the
  interpreter ``OLMX_IMAGE_PYTHON`` names, such as benchmarks/gpu/image_like.sh's Python 3.12
  with torch 2.11), ``wheels.sh`` for its Python version built by this machine's base
  interpreter (as from a fresh clone, whatever its setuptools), and ``REHEARSE=1 smoke.sh`` with
  a small budget: every step reports a line, the budget holds, the install and olmx steps pass,
  the carried protobuf is the one imported, and no step fails (a slow machine may time steps out
  or skip them for the budget), and ``$OUT`` obeys the device's limits on what comes back.
  Without the carried protobuf, the environment probe reports ``olmo_core.train`` failing.

A rehearsal interpreter for a manual run: ``.venv/bin/python -m tests.test_gpu_smoke DIR``
prints its path.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, script_module

#: What the GPU image's ``python3`` has (the research note's package list), here taken from
#: this environment with everything they require; setuptools and pip as a Python 3.12 venv with
#: torch has them. Not triton: the CPU torch does not use it, and the image's triton 3.6
#: differs from this environment's anyway.
IMAGE_PACKAGES = (
    "torch numpy pyyaml rich typer jinja2 matplotlib requests safetensors transformers tokenizers "
    "tensorboard pytest setuptools pip"
).split()
#: The rehearsal interpreter's protobuf: older than googleapis-common-protos 1.76 needs (>=6.33.5),
#: as the image's may be (its version is not known), so that the rehearsal shows the carried
#: one installed and imported.
IMAGE_PROTOBUF = "5.29.5"
#: The rehearsal's budget (seconds from smoke.sh's start).
REHEARSAL_BUDGET = 150
#: The device's limits on what comes back from ``$OUT``.
OUT_FILES, OUT_FILE_BYTES, OUT_DEPTH = 8, 16 * 2**20, 2
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions ``names`` and everything they require (no extras)."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return list(seen.values())


def image_like_python(root: Path) -> Path:
    """A venv under ``root`` set up like the GPU image: torch (this environment's CPU build) and
    the image's other packages preinstalled, nothing of olmx's (no olmx, OLMo-core, hydra,
    torchao). The packages are this environment's, linked into one folder that the venv's
    site-packages names in a ``.pth`` file, file by file where a top-level folder is shared with
    packages the image lacks (``google/``): installing them with pip takes 2.5 minutes here,
    linking them under a second, and the interpreter sees the same files either way. Not
    protobuf: :data:`IMAGE_PROTOBUF` from PyPI (0.4 MiB) instead. This environment's Python and
    torch (CI's 3.11 and 2.13), not the image's 3.12 and 2.11, whose CUDA wheels are gigabytes:
    benchmarks/gpu/image_like.sh makes that one (``OLMX_IMAGE_PYTHON``)."""
    python = root / "venv" / "bin" / "python"
    if python.exists():
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    view = root / "site"
    view.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:", "--target", str(view)]
        + [f"protobuf=={IMAGE_PROTOBUF}"],
        check=True,
        timeout=300,
    )
    wanted = [d for d in _closure(IMAGE_PACKAGES) if _norm(d.metadata["Name"]) != "protobuf"]
    owners: dict[str, set[str]] = {}  # top-level entry -> the distributions that have files in it
    for dist in md.distributions():
        name = _norm(dist.metadata["Name"])
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}:
            owners.setdefault(top, set()).add(name)
    for dist in wanted:
        name = _norm(dist.metadata["Name"])
        for f in dist.files or []:
            if not f.parts or f.parts[0] == ".." or f.parts[0] == "__pycache__":
                continue
            top = f.parts[0]
            whole = owners.get(top) == {name}
            target = view / (top if whole else Path(*f.parts))
            if target.exists() or target.is_symlink():
                continue
            source = Path(dist.locate_file(top if whole else f))
            if not source.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    (site,) = (root / "venv" / "lib").glob("python*/site-packages")
    (site / "image_packages.pth").write_text(f"{view}\n")
    check = (
        "import importlib.util as u, torch, numpy, yaml, rich, jinja2, matplotlib, requests, safetensors, "
        "transformers, google.protobuf as p; missing = [m for m in ('olmx', 'olmo_core', 'hydra', 'omegaconf', "
        f"'torchao') if u.find_spec(m)]; assert not missing, missing; assert p.__version__ == {IMAGE_PROTOBUF!r}"
    )
    subprocess.run([str(python), "-c", check], check=True, timeout=300, cwd=root)
    return python


def _clean_env(**more: str) -> dict[str, str]:
    """This environment less its venv: what a shell on the GPU machine has."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != venv_bin)
    env.update(more)
    return env


def check_out_limits(out: Path) -> None:
    """What the device returns: at most 8 files of 16 MiB, 2 folders deep, plain names."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= OUT_FILES, files
    for path in out.rglob("*"):
        rel = path.relative_to(out)
        assert all(OUT_NAME.match(part) for part in rel.parts), rel
        assert len(rel.parts) - 1 <= OUT_DEPTH, rel
        assert not path.is_symlink(), rel
        if path.is_file():
            assert path.stat().st_size <= OUT_FILE_BYTES, rel


def _smoke_module():
    """benchmarks/gpu/smoke.py as a module (it is a script, not a package)."""
    return script_module("benchmarks/gpu/smoke.py", "gpu_smoke")


def test_a_box_that_runs_out_kills_everything_the_step_started(tmp_path):
    """Even processes in sessions of their own (as olmx's launcher starts torchrun, and torchrun
    its workers) go, found by the step's marker in their environment."""
    smoke = _smoke_module()
    script = "setsid sleep 300 & sleep 300"
    proc = smoke.Proc(["bash", "-c", script], tmp_path / "log", dict(os.environ), tmp_path)
    ended = []
    start = time.time()
    smoke.wait_all({"x": proc}, time.time() + 1.5, lambda *a: ended.append(a[2:]))
    assert ended == [(124, ended[0][1])] and "timed out" in ended[0][1]
    assert time.time() - start < 10
    assert smoke.kill_marked(proc.token) == 0  # nothing left to kill


def test_figures_read_from_a_gpu_run(tmp_path):
    """What the GPU steps compute from a run directory, on a made-up one: tokens/s over a window of
    bunched records (OLMo-core logs a metrics interval at once), time to first step, MFU against
    olmx's H200 peak, graph breaks, recompiles and the save's seconds from the node log."""
    smoke = _smoke_module()
    # Steps 1-10 logged at t=100 (step 1 compiled, 60 s), then 0.5 s per step: 11-20 at 105, ...
    records = [
        {"step": s, "loss": 6.0 - s / 100, "tokens": s * 32768, "time": 100.0 + 5 * ((s - 1) // 10)}
        for s in range(1, 41)
    ]
    win = smoke.window_rate(records, 32768, 10)
    assert win["window"] == "10-40" and abs(win["tokens_per_s"] - 30 * 32768 / 15) < 1e-6
    plan = {"flops_per_token": 7.25e9, "device_name": "NVIDIA H200", "dtype": "bfloat16"}
    assert abs(smoke.mfu(65536.0, plan) - 65536 * 7.25e9 / 989e12) < 1e-4
    assert smoke.mfu(65536.0, {**plan, "device_name": "cpu"}) is None

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "events.jsonl").write_text(json.dumps({"event": "start", "time": 30.0}) + "\n")
    stamp = "[default0]:2026-12-03 10:00:{:06.3f}\tvm:0\tolmo_core.train.trainer:1177\tINFO\t"
    (run / "logs" / "node0.log").write_text(
        "[default0]:V1203 symbolic_convert.py] [0/0] [__graph_breaks] Graph break in user code at x.py:1\n"
        "[default0]:V1203 [0/1] [__recompiles] Recompiling function forward in /m.py:10\n"
        + stamp.format(1.5)
        + "Saving checkpoint for step 40 to '/tmp/x/checkpoints/step40'...\n"
        + stamp.format(13.75)
        + "Checkpoint saved\n"
    )
    (run / "plan.yaml").write_text(
        "world: {device_name: NVIDIA H200}\ndtypes: {param: bfloat16}\nbatch: {seq_len: 4096, global_seqs: 8}\n"
        "execution: {compile: true, notes: ['attention: auto = torch SDPA']}\n"
        'sections:\n  time:\n  - [FLOPs per token, "7.25 G = ...; OLMo-core\'s count without recompute: 7.25 G"]\n'
    )
    got = smoke.read_olmx_run(run, 0.0)
    assert got["graph_breaks"] == 1 and got["recompiles"] == 1 and got["save_s"] == 12.25, got
    assert got["steps"] == 40 and got["startup_s"] == 30.0 and got["first_logged_step"] == 10
    assert got["time_to_first_step_s"] == 100.0 - 9 * 0.5  # the first bunch's time less 9 steady steps
    assert abs(got["mfu"] - got["tokens_per_s"] * 7.25e9 / 989e12) < 1e-4


def test_gpu_memory_sampler_reads_nvidia_smi(tmp_path, monkeypatch):
    """The 1B steps' ``nvidia-smi`` sampling, with a stand-in ``nvidia-smi`` on PATH."""
    smoke = _smoke_module()
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '81234, 97'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = smoke.GpuSampler(True, interval=0.05)
    time.sleep(0.5)
    got = sampler.stop()
    assert got["gpu_mem_used_max_mib"] == 81234 and got["gpu_util_mean"] == 97.0 and got["gpu_samples"] >= 1
    assert smoke.GpuSampler(False).stop() == {}


def test_an_error_of_the_script_fails_its_step_only(tmp_path):
    """A figure smoke.py did not expect ends that step (reported, with the traceback), not the run."""
    smoke = _smoke_module()
    now = time.time()
    report = smoke.Report(tmp_path, "rehearse", now, now + 60)
    report.plan(["a", "b"])
    ctx = smoke.Ctx("rehearse", sys.executable, tmp_path, tmp_path / "s", tmp_path, "cpu", report, now + 60)

    def broken(_ctx):
        raise KeyError("tokens_per_s")

    assert smoke.guarded(ctx, ["a"], broken) is None
    smoke.guarded(ctx, ["b"], lambda c: c.report.skip("b", "fine"))
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["status"]) for r in lines[1:]] == [("a", "fail"), ("b", "skipped")]
    assert "KeyError" in lines[1]["note"] and "Traceback" in (tmp_path / "failures.txt").read_text()


def test_smoke_script_refuses_without_a_gpu(tmp_path):
    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real thing
        return
    proc = subprocess.run(
        ["bash", "benchmarks/gpu/smoke.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OUT": str(tmp_path / "out")},
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no CUDA GPU visible" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_every_smoke_run_plans_for_an_h200(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu/smoke.py", "--plan-only", "--out", str(tmp_path / "out")]
        + ["--scratch", str(tmp_path / "scratch")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    plan, ran = lines[0], {r["step"]: r for r in lines[1:]}
    assert plan["step"] == "plan" and set(plan["steps"]) == set(ran)
    assert ran["30m mxfp8 fsdp"]["note"] == "needs compute capability 10.0"  # an H200 is SM90
    assert [r["status"] for r in ran.values()].count("pass") == 9  # 8 paths of the 30M model and the 1B
    assert ran["30m bf16 fsdp+compile budget"]["status"] == "pass"  # budget checkpointing plans where compiled
    assert "GiB" in ran["1b"]["plan_estimated_peak"]
    assert "GPU smoke (plans only)" in (tmp_path / "out" / "summary.md").read_text()
    check_out_limits(tmp_path / "out")


@pytest.fixture(scope="session")
def image_python(tmp_path_factory) -> Path:
    """One image-like interpreter per session: ``OLMX_IMAGE_PYTHON`` where set (made by
    benchmarks/gpu/image_like.sh), else :func:`image_like_python`."""
    given = os.environ.get("OLMX_IMAGE_PYTHON")
    if given:
        return Path(given)
    return image_like_python(tmp_path_factory.mktemp("image-python"))


def _build_python() -> str:
    """What builds the wheels: this machine's base interpreter (as ``python3`` on a fresh clone
    without a venv: pyenv's 3.11 here, with setuptools 65, older than olmx's build needs), or
    this venv's where the base has no pip."""
    base = getattr(sys, "_base_executable", sys.executable)
    has_pip = subprocess.run([base, "-m", "pip", "--version"], capture_output=True, timeout=60, check=False)
    return base if has_pip.returncode == 0 else sys.executable


def test_the_install_takes_what_fits_the_interpreter_and_protobuf_where_needed(tmp_path):
    """Wheels of wheels.sh's kinds against CPython 3.11's tags: a 3.12 binary is left out, abi3
    and pure wheels go in; the carried protobuf goes in where the interpreter lacks one or has
    one older than 6.33.5 (or 8 and later), not where its own fits."""
    from packaging import tags

    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]
    cp311 = [*tags.cpython_tags((3, 11), platforms=platforms), *tags.compatible_tags((3, 11), platforms=platforms)]
    supported = {str(t) for t in cp311}
    smoke = _smoke_module()
    names = [
        "olmx-0.1.0-py3-none-any.whl",
        "shellingham-1.5.4-py2.py3-none-any.whl",
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "cryptography-50.0.2-cp311-abi3-manylinux_2_28_x86_64.whl",
        "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
    ]
    wheels = [tmp_path / n for n in names]
    assert {smoke.wheel_fits(n, supported) for n in names[:2] + names[3:]} == {True}
    for have, goes_in in ((None, True), ("5.29.5", True), ("6.33.4", True), ("6.33.5", False), ("8.0.0", True)):
        chosen, unfit, kept = smoke.select_wheels(wheels, supported, lambda d, v=have: v if d == "protobuf" else "x")
        assert unfit == [names[2]]
        assert (wheels[4] in chosen) is goes_in and kept == ({} if goes_in else {"protobuf": have}), have
        assert wheels[:2] + wheels[3:4] == [w for w in chosen if w != wheels[4]]
    assert smoke.select_wheels(wheels, None, lambda d: None)[1] == []  # no tags known: all tried
    assert smoke.version_tuple("2.11.0+cu130") == (2, 11, 0) and smoke.version_tuple("6.33.5rc1") == (6, 33, 5)


@pytest.mark.rehearsal
def test_rehearsal_on_an_image_like_interpreter(image_python, tmp_path):
    wheels, out, scratch = tmp_path / "whl", tmp_path / "out", tmp_path / "scratch"
    built = subprocess.run(
        ["bash", "benchmarks/gpu/wheels.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=_clean_env(PYTHON=str(image_python), WHL_DIR=str(wheels), BUILD_PYTHON=_build_python()),
    )
    assert built.returncode == 0, built.stdout + built.stderr
    names = [p.name for p in wheels.glob("*.whl")]
    for prefix in ("antlr4_python3_runtime-4.9.3-", "olmx-", "ai2_olmo_core-3.0.0-", "torchao-0.15.0-", "protobuf-"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    probe = "import sys, torch; print('cp%d%d' % sys.version_info[:2], torch.__version__)"
    tag, image_torch = subprocess.run(
        [str(image_python), "-c", probe], capture_output=True, text=True, timeout=300, check=True, env=_clean_env()
    ).stdout.split()
    assert all("-cp3" not in n or tag in n or "abi3" in n for n in names), names  # that Python's binaries

    start = time.time()
    smoke = subprocess.run(
        ["bash", "benchmarks/gpu/smoke.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=REHEARSAL_BUDGET + 60,
        check=False,
        env=_clean_env(
            REHEARSE="1",
            PYTHON=str(image_python),
            OUT=str(out),
            WHL_DIR=str(wheels),
            SCRATCH=str(scratch),
            BUDGET=str(REHEARSAL_BUDGET),
        ),
    )
    wall = time.time() - start
    report = smoke.stdout + smoke.stderr + (out / "progress.log").read_text()
    assert wall < REHEARSAL_BUDGET + 10, report  # the budget held (smoke.sh's own start counts)
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    plan, results = lines[0], {r["step"]: r for r in lines[1:]}
    assert plan["step"] == "plan" and plan["mode"] == "rehearse"
    assert set(results) == set(plan["steps"]), report  # every step reported
    assert smoke.returncode in (0, 1), report  # not cut by the backstop
    assert results["install"]["status"] == "pass" and results["install"]["installer"] == "pip", report
    assert "interpreter_has" not in results["install"], results["install"]  # its protobuf is too old
    assert results["olmx"]["status"] == "pass", report  # olmx and its plugins from the wheels
    statuses = {name: r["status"] for name, r in results.items()}
    assert "fail" not in statuses.values(), (statuses, (out / "failures.txt").read_text())
    assert results["30m bf16 fsdp+compile"]["note"].startswith("needs CUDA")
    env = results["environment"]
    if env["status"] == "pass":  # the carried protobuf is the one found, and the import chain holds
        assert env["torch"] == image_torch and env["protobuf"] == "7.36.2" and env["import_errors"] == {}, env
        assert {"olmo_core.train", "olmo_core.io"} <= set(env["imports"]), env
    for name in ("30m bf16 ddp", "1b"):
        if statuses[name] == "pass":
            assert results[name]["last_loss"] < results[name]["first_loss"], results[name]
    if statuses["1b"] == "pass":
        assert results["1b"]["save_s"] >= 0 and results["1b"]["tokens_per_s"] > 0, results["1b"]
    assert "olmx GPU smoke (CPU rehearsal)" in (out / "summary.md").read_text()
    check_out_limits(out)
    assert not any((scratch / "runs").glob("*"))  # every run directory removed once read

    # An interpreter without pip gets the wheels unzipped: olmx's entry points are found as well.
    site = tmp_path / "unzipped"
    site.mkdir()
    olmx_wheels = [p for p in wheels.glob("*.whl") if p.name.startswith(("olmx-", "entry_points_txt-"))]
    _smoke_module().unzip_wheels(olmx_wheels, site)
    found = subprocess.run(
        [str(image_python), "-c", "import importlib.metadata as m; print(m.entry_points(group='olmx.layers').names)"],
        env=_clean_env(PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "moe" in found.stdout and "engram" in found.stdout

    # Without the carried protobuf, `import olmo_core` still works but the probe catches the rest.
    installed = scratch / "site"
    for path in [installed / "google" / "protobuf", *installed.glob("protobuf-*.dist-info")]:
        shutil.rmtree(path)
    probed = subprocess.run(
        [str(image_python), "benchmarks/gpu/smoke.py", "--probe-env", "--scratch", str(tmp_path / "probe")],
        cwd=REPO,
        env=_clean_env(PYTHONPATH=str(installed), PYTHONSAFEPATH="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (line,) = [x for x in probed.stdout.splitlines() if x.startswith("SMOKE_ENV ")]
    env = json.loads(line[len("SMOKE_ENV ") :])
    assert env["protobuf"] == IMAGE_PROTOBUF and "olmo_core" in env["imports"], env
    assert {"olmo_core.train", "olmo_core.io"} <= set(env["import_errors"]), env
    assert "protobuf" in env["import_errors"]["olmo_core.train"].lower(), env


if __name__ == "__main__":
    print(image_like_python(Path(sys.argv[1]).absolute()))
