"""The GPU smoke run (``benchmarks/gpu/smoke.sh`` starts it): every olmx GPU path once, timed.

Steps, each recorded as one JSON object in ``OUT/smoke.json`` and summarised in
``OUT/RESULTS.md`` (a section to paste into ``benchmarks/results/gpu.md``):

1. environment: GPU name and compute capability, torch/CUDA/OLMo-core/torchao versions,
   whether torchao's C++ extensions loaded, whether flash-attn is installed;
2. ``pytest -m gpu`` (the parity tests marked ``gpu``), pass/fail counts;
3. a 1B run (``model=olmo3_1b parallel=[fsdp]``, the fast defaults: ``precision=auto`` ->
   bf16, compile on, the attention rule), 30 steps: tokens/s, MFU, peak memory from its
   ``metrics.jsonl``; then the same model and batch through OLMo-core alone, set up as its
   OLMo 3 training scripts (``benchmarks/handwritten_train.py --olmo3-1b``), and the tokens/s
   ratio olmx / OLMo-core (the goal: within 2%);
4. 10-step runs of a 30M model through each path: ddp + bf16, fsdp + compile, fp8 (rowwise
   and tensorwise), MXFP8 where the GPU has SM100, MoE portable and olmo_core, Engram.

Every run is ``olmx train`` itself (the CLI, torchrun, one process), on the embedded stdlib
corpus (byte-level, nothing downloaded). ``--plan-only`` plans every run (``--dry-run``, for the
GPU named by ``--gpu-name``) without a GPU: what the CPU checks of this script run.

    python benchmarks/gpu/smoke.py --out DIR [--plan-only] [--gpu-name 'NVIDIA H200']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLMX = [sys.executable, "-m", "olmx"]
COMMON = [
    "trainer.report=false",
    "trainer.save_interval=100000",
    "data=stdlib",
    "infra.nproc_per_node=1",
    "parallel=[]",
]
SMALL = [
    "model=olmo3_30m",
    "data.seq_len=1024",
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=8",
    "trainer.max_steps=10",
    "trainer.warmup_steps=2",
]
#: (name, overrides) of the 30M path runs; ``sm`` is the compute capability a path needs.
PATHS: list[tuple[str, list[str], tuple[int, int]]] = [
    ("bf16", ["precision=bf16", "trainer.compile=false"], (8, 0)),
    ("bf16+compile (fsdp)", ["precision=bf16", "parallel=[fsdp]"], (8, 0)),
    ("fp8 tensorwise", ["precision=fp8", "precision.fp8.recipe=tensorwise"], (8, 9)),
    ("fp8 rowwise", ["precision=fp8", "precision.fp8.recipe=rowwise"], (9, 0)),
    ("mxfp8", ["precision=mxfp8"], (10, 0)),
    ("moe portable", ["layers=[moe]", "layers.moe.num_experts=8", "layers.moe.backend=portable"], (8, 0)),
    ("moe olmo_core", ["layers=[moe]", "layers.moe.num_experts=8", "layers.moe.backend=olmo_core"], (8, 0)),
    ("engram", ["layers=[engram]", "layers.engram.layer_ids=[1]"], (8, 0)),
]
BIG = [
    "model=olmo3_1b",
    "parallel=[fsdp]",
    "data.seq_len=4096",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.max_steps=30",
    "trainer.warmup_steps=5",
]


def environment() -> dict:
    """What the GPU machine has."""
    import importlib.util

    import torch

    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
        "flash_attn_3": importlib.util.find_spec("flash_attn_interface") is not None,
    }
    for name in ("olmo_core", "torchao", "triton"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", "?")
        except ImportError:
            env[name] = None
    if env["torchao"]:
        try:  # torchao 0.15 loads its C++ extensions only with torch 2.9.1/2.10
            env["torchao_cpp_extensions"] = torch._C._dispatch_has_kernel_for_dispatch_key(
                "torchao::mxfp8_quantize", "CUDA"
            )
        except (AttributeError, RuntimeError):
            env["torchao_cpp_extensions"] = False
    return env


def run_step(args: list[str], *, timeout: int, env: dict | None = None) -> dict:
    """Run one command of the smoke run: its exit status (124 on timeout), seconds, and the
    tail of its output when it failed."""
    start = time.time()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"timed out after {timeout} s: {exc}"
    result: dict = {"exit": code, "seconds": round(time.time() - start, 1)}
    if code:
        result["tail"] = out[-1500:]
    return result


def olmx_train(run_dir: Path, overrides: list[str], *, plan_only: bool, gpu_name: str, timeout: int) -> dict:
    """One ``olmx train`` (or its ``--dry-run`` for ``gpu_name``); its outcome and metrics."""
    args = [*OLMX, "train", *COMMON, *overrides, f"trainer.run_dir={run_dir}"]
    if plan_only:
        args += ["infra=slurm", "infra.gpus_per_node=1", f"infra.gpu_name={gpu_name}", "--dry-run"]
        args = [a for a in args if a != "infra.nproc_per_node=1"]
    result = run_step(args, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    metrics = run_dir / "metrics.jsonl"
    if not plan_only and metrics.exists():
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        later = records[len(records) // 2 :] or records
        pick = lambda key: statistics.median([r[key] for r in later if r.get(key) is not None] or [float("nan")])  # noqa: E731
        result.update(
            steps=len(records),
            first_loss=records[0]["loss"] if records else None,
            last_loss=records[-1]["loss"] if records else None,
            tokens_per_s=pick("tokens_per_s"),
            mfu=pick("mfu"),
            peak_mem_mib=max((r.get("peak_mem_mib") or 0) for r in records or [{}]),
        )
    return result


def olmo_core_script(run_dir: Path, *, timeout: int) -> dict:
    """``benchmarks/handwritten_train.py --olmo3-1b`` with :data:`BIG`'s batch, one GPU, under
    torchrun as olmx starts it; tokens/s from its per-step clock (later half of the run)."""
    seq, gbs, mbs, steps, warmup = 4096, 8, 4, 30, 5  # as BIG
    args = [
        *[sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1", "--standalone"],
        str(REPO / "benchmarks" / "handwritten_train.py"),
        *["--olmo3-1b", "--run-dir", str(run_dir), "--steps", str(steps), "--warmup", str(warmup)],
        *["--seq-len", str(seq), "--global-seqs", str(gbs), "--micro-seqs", str(mbs)],
    ]
    result = run_step(args, timeout=timeout)
    timing = run_dir / "timing.jsonl"
    if timing.exists():
        recs = [json.loads(line) for line in timing.read_text().splitlines() if line.strip()]
        later = recs[len(recs) // 2 :]
        rates = [
            (b["step"] - a["step"]) * seq * gbs / (b["time"] - a["time"])
            for a, b in zip(later, later[1:], strict=False)
            if b["time"] > a["time"]
        ]
        result.update(
            steps=recs[-1]["step"] if recs else 0,
            first_loss=recs[0]["loss"] if recs else None,
            last_loss=recs[-1]["loss"] if recs else None,
            tokens_per_s=statistics.median(rates) if rates else None,
        )
    return result


def pytest_gpu() -> dict:
    """``pytest -m gpu``: the parity tests that need CUDA."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        check=False,
    )
    return {
        "exit": proc.returncode,
        "summary": (proc.stdout.strip().splitlines() or [""])[-1],
        "tail": proc.stdout[-1500:] if proc.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "gpu" / "out")
    parser.add_argument("--plan-only", action="store_true", help="plan every run (--dry-run); needs no GPU")
    parser.add_argument("--gpu-name", default="NVIDIA H200", help="the GPU --plan-only plans for")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    if args.plan_only:
        from olmx.launch.devices import gpu_compute_capability

        cc = gpu_compute_capability(args.gpu_name)
    else:
        import torch

        if not torch.cuda.is_available():
            print(
                "smoke.py: no CUDA GPU (torch.cuda.is_available() is false); use --plan-only to check the plans",
                file=sys.stderr,
            )
            return 3
        records.append({"step": "environment", **environment()})
        cc = tuple(records[0]["capability"])
        records.append({"step": "pytest -m gpu", **pytest_gpu()})
    runs = args.out / "runs"
    big = olmx_train(runs / "1b", BIG, plan_only=args.plan_only, gpu_name=args.gpu_name, timeout=200)
    records.append({"step": "olmo3_1b (fast defaults)", **big})
    if args.plan_only:
        records.append({"step": "olmo3_1b, OLMo-core alone", "skipped": "runs only on a GPU"})
    else:
        ref = olmo_core_script(runs / "1b_olmo_core", timeout=200)
        if big.get("tokens_per_s") and ref.get("tokens_per_s"):
            ref["summary"] = f"olmx / OLMo-core tokens/s = {big['tokens_per_s'] / ref['tokens_per_s']:.3f}"
        records.append({"step": "olmo3_1b, OLMo-core alone", **ref})
    (args.out / "smoke.json").write_text(json.dumps(records, indent=2))  # keep what ran so far
    for name, overrides, need in PATHS:
        if cc is not None and cc < need:
            records.append({"step": name, "skipped": f"needs compute capability {need[0]}.{need[1]}"})
            continue
        slug = name.replace(" ", "_").replace("+", "_").replace("(", "").replace(")", "")
        result = olmx_train(
            runs / slug, [*SMALL, *overrides], plan_only=args.plan_only, gpu_name=args.gpu_name, timeout=90
        )
        records.append({"step": name, **result})
        (args.out / "smoke.json").write_text(json.dumps(records, indent=2))  # keep what ran so far
    (args.out / "smoke.json").write_text(json.dumps(records, indent=2))
    lines = [
        f"### GPU smoke, {time.strftime('%Y-%m-%d %H:%M')}{' (plans only)' if args.plan_only else ''}",
        "",
        "| step | exit | s | tokens/s | MFU | peak MiB | loss first -> last | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["step"] == "environment":
            lines.insert(2, "environment: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "step") + "\n")
            continue
        loss = f"{r.get('first_loss', '-')} -> {r.get('last_loss', '-')}" if r.get("first_loss") is not None else "-"
        lines.append(
            f"| {r['step']} | {r.get('exit', '-')} | {r.get('seconds', '-')} | {r.get('tokens_per_s', '-')} | "
            f"{r.get('mfu', '-')} | {r.get('peak_mem_mib', '-')} | {loss} | "
            f"{r.get('skipped') or r.get('summary') or ''} |"
        )
    (args.out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [r["step"] for r in records if r.get("exit")]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
