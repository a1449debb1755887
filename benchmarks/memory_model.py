"""The plan's memory estimate (``olmx.plan.memory``) against measured peaks, per strategy.

Each configuration is trained for 2 steps with ``olmx train`` (real processes; gloo on CPU);
the measured peak is the largest ``peak_mem_mib`` of any process in ``summary.json``: on CPU
the resident-set high-water mark minus that of a near-empty model run the same way (the
interpreter, torch, OLMo-core, the data loader), with glibc returning freed blocks
(``MALLOC_MMAP_THRESHOLD_=65536``) so that it follows the live tensors; on CUDA ``torch.cuda.max_memory_allocated``
(each run is a fresh process, so the allocator's peak starts at zero; no baseline is taken off).
The estimate is the plan's own (``olmx train --dry-run`` computes the same), for the device of
the machine it runs on. The rows are split into those the estimate's constants were fitted on
and those held out (predicted): the ratio ``measured / estimate`` is reported for both.

Prints the table and writes it, with the other device's rows when an earlier run recorded
them, to ``benchmarks/results/memory_model.md`` (raw numbers in ``memory_model.json``, which
a run on the other device merges with). A row that needs more GPUs than the machine has is
skipped there. ``--estimate-only`` recomputes the estimates of the recorded rows after a
change to the memory model, measuring nothing. All 24 rows take about 35 minutes on 2 shared
CPU cores; the 1-process rows on one GPU a few minutes.

``--compile`` measures the rows of :data:`COMPILE_ROWS` (or those ``--only`` names) twice in one
run, eager and under ``torch.compile`` (inductor; on CPU through :data:`COMPILE_HOOK`, since
olmx and OLMo-core compile only with CUDA), each against its own baseline, and records both
ratios side by side in a section of its own (the main table stays as recorded).

    .venv/bin/python benchmarks/memory_model.py [--only SUBSTRING ...] [--compile] [--keep DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OLMX = [sys.executable, "-m", "olmx"]
# Step 2 is the first whose backward pass has the optimizer state (created in step 1's step).
# Eager (torch.compile changes what is saved for backward) and the same rows on every device.
COMMON = ["trainer.report=false", "trainer.max_steps=2", "trainer.save_interval=1000", "trainer.warmup_steps=1"]
COMMON += ["trainer.compile=false"]
MID = ["model.d_model=512", "model.n_layers=4", "model.hidden_size=2048", "model.n_heads=8"]
WIDE = ["model.d_model=1024", "model.n_layers=8", "model.hidden_size=4096", "model.n_heads=16"]
BASE = ["model.d_model=32", "model.n_layers=1", "model.hidden_size=64", "model.n_heads=2", "data.seq_len=16"]
BASE += ["infra.nproc_per_node=1", "trainer.global_batch_size=1", "trainer.micro_batch_size=1"]
MIB = 1 << 20
# glibc serves allocations above 64 KiB with mmap, so freed tensors go back to the OS and the
# resident-set high-water mark follows the live tensors (inherited by torchrun's workers).
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")


def _no_eval() -> list[str]:
    """Evaluation off where this olmx has it: it only adds time (no memory above training's)."""
    from dataclasses import fields

    from olmx.config.schema import RunConfig

    return ["eval.interval=0"] if "eval" in {f.name for f in fields(RunConfig)} else []


COMMON += _no_eval()


def procs(n: int) -> list[str]:
    """``n`` processes on this machine."""
    return [f"infra.nproc_per_node={n}"]


def batch(seq_len: int, micro: int, ranks: int = 1) -> list[str]:
    """``micro`` sequences of ``seq_len`` per data-parallel rank, one micro-batch per step."""
    return [
        f"data.seq_len={seq_len}",
        f"trainer.global_batch_size={micro * ranks}",
        f"trainer.micro_batch_size={micro}",
    ]


MOE = ["layers=[moe]", "layers.moe.num_experts=4", "layers.moe.top_k=2", "layers.moe.hidden_size=1024"]
ENGRAM = ["layers=[engram]", "layers.engram.layer_ids=[1]", "layers.engram.vocab_size_per_ngram=[20000,20000]"]


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    name: str
    overrides: list[str]
    #: The estimate's constants were fitted on this row (False: held out, predicted).
    fitted: bool

    @property
    def args(self) -> list[str]:
        """The overrides, float32 unless the case names a precision (``auto`` is bf16 on GPUs)."""
        own = any(o.startswith("precision=") for o in self.overrides)
        return [*COMMON, *self.overrides, *([] if own else ["precision=fp32"])]

    @property
    def nproc(self) -> int:
        """Processes the run starts."""
        return int(next(o for o in self.overrides if o.startswith("infra.nproc_per_node=")).split("=")[1])


CASES = [
    Case("1 proc, 17M, 4 x 512 tokens", [*procs(1), *MID, *batch(512, 4)], True),
    Case("1 proc, 17M, 4 x 2048 tokens", [*procs(1), *MID, *batch(2048, 4)], True),
    Case(
        "1 proc, 17M, 4 x 2048, AC full",
        [*procs(1), *MID, *batch(2048, 4), "trainer.activation_checkpointing=full"],
        True,
    ),
    Case("1 proc, 135M, 1 x 128 tokens", [*procs(1), *WIDE, *batch(128, 1)], True),
    Case("2 proc DDP, 135M", [*procs(2), "parallel=[ddp]", *WIDE, *batch(128, 1, 2)], True),
    Case("2 proc FSDP, 135M", [*procs(2), "parallel=[fsdp]", *WIDE, *batch(128, 1, 2)], True),
    Case("1 proc, 17M, 4 x 512, bf16", [*procs(1), *MID, *batch(512, 4), "precision=bf16"], True),
    Case("2 proc ddp+ulysses 2, 17M, 4 x 2048", [*procs(2), "parallel=[ddp,ulysses]", *MID, *batch(2048, 4)], True),
    Case("2 proc DDP, MoE 4 experts", [*procs(2), "parallel=[ddp]", *MID, *MOE, *batch(512, 4, 2)], True),
    Case("1 proc, Engram 2 x 20k x 8 heads", [*procs(1), *MID, *ENGRAM, *batch(512, 4)], True),
    # held out at first (0.87 of the measured peak); then the long_context term was recounted
    Case(
        "1 proc, 17M, 4 x 2048, AC long_context",
        [*procs(1), *MID, *batch(2048, 4), "trainer.activation_checkpointing=long_context"],
        True,
    ),
    # held out at first (0.71): OLMo-core shards FSDP over dp x cp, which the estimate missed
    Case(
        "2 proc fsdp+ulysses 2, 4 x 2048, AC long_context",
        [
            *procs(2),
            "parallel=[fsdp,ulysses]",
            *MID,
            *batch(2048, 4),
            "trainer.activation_checkpointing=long_context",
        ],
        True,
    ),
    # held out: predicted by the constants fitted above
    Case("1 proc, 17M, 4 x 2048, bf16", [*procs(1), *MID, *batch(2048, 4), "precision=bf16"], False),
    Case(
        "2 proc FSDP, 17M, 4 x 512, bf16",
        [*procs(2), "parallel=[fsdp]", *MID, *batch(512, 4, 2), "precision=bf16"],
        False,
    ),
    Case(
        "2 proc ddp+ulysses 1, 17M, 4 x 2048",
        [*procs(2), "parallel=[ddp,ulysses]", "parallel.ulysses.degree=1", *MID, *batch(2048, 4, 2)],
        False,
    ),
    Case(
        "4 proc ddp+ulysses 4, 17M GQA 2 kv, 4 x 2048",
        [*procs(4), "parallel=[ddp,ulysses]", "parallel.ulysses.degree=4", *MID, "model.n_kv_heads=2", *batch(2048, 4)],
        False,
    ),
    Case(
        "4 proc HSDP 2 x 2, 17M, 4 x 512",
        [*procs(4), "parallel=[hsdp]", "parallel.hsdp.shard_degree=2", *MID, *batch(512, 4, 4)],
        False,
    ),
    Case(
        "2 proc FSDP, 17M, 4 x 2048, AC full",
        [*procs(2), "parallel=[fsdp]", *MID, *batch(2048, 4, 2), "trainer.activation_checkpointing=full"],
        False,
    ),
    Case("2 proc ddp_ep 2, MoE 4 experts", [*procs(2), "parallel=[ddp_ep]", *MID, *MOE, *batch(512, 4, 2)], False),
    Case(
        "1 proc, MoE 4 experts, AC full",
        [*procs(1), *MID, *MOE, *batch(512, 4), "trainer.activation_checkpointing=full"],
        False,
    ),
    # held out: pipeline stages (half the blocks, one vocab matrix) and the micro-batches their
    # schedule keeps in flight (1F1B: as many as stages; GPipe: all 4)
    Case(
        "2 proc ddp x pp 2 1F1B, 17M, 4 micro x 512",
        [
            *procs(2),
            "parallel=[ddp,pp]",
            "parallel.pp.schedule=1F1B",
            *MID,
            *batch(512, 2),
            "trainer.global_batch_size=8",
        ],
        False,
    ),
    Case(
        "2 proc ddp x pp 2 GPipe, 17M, 4 micro x 512",
        [
            *procs(2),
            "parallel=[ddp,pp]",
            "parallel.pp.schedule=GPipe",
            *MID,
            *batch(512, 2),
            "trainer.global_batch_size=8",
        ],
        False,
    ),
    # held out: a stage sliced over 2 tensor-parallel ranks (half a stage's weights and activations)
    Case(
        "4 proc fsdp x tp 2 x pp 2 1F1B, 17M, 4 micro x 512",
        [
            *procs(4),
            "parallel=[fsdp,tp,pp]",
            "parallel.pp.schedule=1F1B",
            *MID,
            *batch(512, 2),
            "trainer.global_batch_size=8",
        ],
        False,
    ),
    Case(
        "2 proc DDP, Engram sharded 1d",
        [*procs(2), "parallel=[ddp]", *MID, *ENGRAM, "layers.engram.sharding=1d", *batch(512, 4, 2)],
        False,
    ),
]


#: The rows ``--compile`` re-measures by default: float32 with activations dominating, autocast
#: bf16 over replicated parameters, FSDP2's bf16 parameters over 2 processes (the GPU default's
#: layout), full activation checkpointing (compiled blocks recomputed in backward).
COMPILE_ROWS = [
    "1 proc, 17M, 4 x 2048 tokens",
    "1 proc, 17M, 4 x 512, bf16",
    "2 proc FSDP, 17M, 4 x 512, bf16",
    "1 proc, 17M, 4 x 2048, AC full",
]
#: ``sitecustomize`` of the compiled runs' workers (``--compile`` on CPU; PYTHONPATH, with
#: ``OLMX_BENCH_COMPILE=1``): OLMo-core's train module compiles the blocks only where
#: ``torch.cuda.is_available()`` and olmx plans ``torch.compile`` only with CUDA, so in the
#: process that ``olmx run`` starts the train module is asked to compile (``compile_model``) and
#: OLMo-core's ``parallelize_model`` sees CUDA as available for that one check: the blocks are
#: compiled where they are on a GPU (after activation checkpointing, before DDP/FSDP, with
#: DDP's compiled-autograd settings), with torch.compile's default backend, inductor.
COMPILE_HOOK = '''"""Written by benchmarks/memory_model.py --compile (see COMPILE_HOOK there)."""
import os
import sys

_argv = sys.orig_argv  # a worker: python [-u] -m olmx run PLAN
_worker = any(_argv[i : i + 3] == ["-m", "olmx", "run"] for i in range(len(_argv)))
if os.environ.get("OLMX_BENCH_COMPILE") == "1" and _worker:

    def _install():
        import olmx.worker.train as train

        config_of = train.train_module_config

        def train_module_config(plan, reg, param_names=None):
            import olmo_core.train.train_module.transformer.common as common
            import torch

            class Cuda:
                def __getattr__(self, name):
                    return getattr(torch.cuda, name)

                @staticmethod
                def is_available():
                    return True

            class Torch:
                cuda = Cuda()

                def __getattr__(self, name):
                    return getattr(torch, name)

            common.torch = Torch()  # parallelize_model's "if torch.cuda.is_available(): compile"
            config = config_of(plan, reg, param_names)
            config.compile_model = True
            return config

        train.train_module_config = train_module_config

    _install()
'''
#: What OLMo-core logs in each worker when it compiled the model.
COMPILED_LOG = "Applied torch.compile() to the model"


def compile_env(root: Path) -> dict[str, str]:
    """The environment of ``olmx train`` whose workers compile (CPU): :data:`COMPILE_HOOK` as
    ``sitecustomize`` first on PYTHONPATH (:func:`measured_mib` adds a cold inductor cache)."""
    hook = root / "compile_hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(COMPILE_HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OLMX_BENCH_COMPILE": "1"}


def measured_mib(args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> float:
    """The largest per-process peak of a run; with ``env`` (:func:`compile_env`) compiled, with
    an inductor cache of its own that starts empty (as on a fresh machine; a cache hit would
    skip compilation and its memory), and checked to have compiled (OLMo-core says so in rank
    0's log)."""
    if env is not None:
        env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(run_dir.parent / f"{run_dir.name}-inductor")}
    proc = subprocess.run(
        [*OLMX, "train", *args, f"trainer.run_dir={run_dir}"], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{args}: olmx train failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    if env is not None:
        logs = "".join(f.read_text(errors="replace") for f in run_dir.rglob("*.log")) + proc.stdout + proc.stderr
        if COMPILED_LOG not in logs:
            raise SystemExit(f"{args}: the workers did not compile (no '{COMPILED_LOG}' in {run_dir}'s logs)")
    return max(p["peak_mem_mib"] for p in summary["processes"])


def estimate_run(args: list[str], run_dir: Path) -> tuple[str, dict[str, float]]:
    """The plan's device and its memory estimate's terms, in MiB."""
    from olmx.plan.resolve import estimate_run as plan_estimate
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    plan = plan_from_overrides([*args, f"trainer.run_dir={run_dir}"], reg)
    e = plan_estimate(plan.run, plan.world, reg).est
    return plan.world.device, {
        "state": (e.params + e.grads + e.optimizer + e.buffers) / MIB,
        "activations": e.activations / MIB,
        "estimate": e.peak / MIB,
    }


def gpus() -> int:
    """CUDA devices here (0 without CUDA), without importing torch into this process."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def table(record: dict[str, dict[str, dict[str, float]]]) -> str:
    """The markdown table of every case, with a column group per device recorded."""
    devices = [d for d in ("cpu", "cuda") if d in record]
    head = "| configuration | set |"
    rule = "|---|---|"
    for d in devices:
        what = "measured - base" if d == "cpu" else "max allocated"
        head += f" {d}: state + buffers | {d}: activations | {d}: estimate | {d}: {what} | {d}: measured / estimate |"
        rule += "---:|---:|---:|---:|---:|"
    lines = [head, rule]
    for case in CASES:
        row = f"| {case.name} | {'fitted' if case.fitted else 'held out'} |"
        for d in devices:
            r = record[d].get(case.name)
            if r is None:
                row += " | | | skipped | |"
            else:
                cells = [f"{r[k]:.0f}" for k in ("state", "activations", "estimate", "measured")]
                row += " " + " | ".join([*cells, f"{r['measured'] / r['estimate']:.2f}"]) + " |"
        lines.append(row)
    return "\n".join(lines)


def summary(record: dict[str, dict[str, dict[str, float]]]) -> str:
    """Per device and set: the range of the ratios and how many rows are within 15%."""
    out = []
    for d, rows in record.items():
        for fitted in (True, False):
            ratios = [r["measured"] / r["estimate"] for c in CASES if c.fitted == fitted and (r := rows.get(c.name))]
            if ratios:
                within = sum(abs(x - 1) <= 0.15 for x in ratios)
                out.append(
                    f"- {d}, {'fitted' if fitted else 'held out'}: {len(ratios)} rows, measured / estimate "
                    f"{min(ratios):.2f}-{max(ratios):.2f}, {within} of {len(ratios)} within 15%"
                )
    return "\n".join(out)


def compile_table(compiled: dict) -> str:
    """``--compile``'s rows: the same estimate against the eager and the compiled peak."""
    lines = [
        "| configuration | device | estimate | eager: measured | eager: measured / estimate "
        "| compiled: measured | compiled: measured / estimate | compiled / eager | run time (s): eager, compiled |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for device, rows in compiled.get("rows", {}).items():
        for case in CASES:
            if (r := rows.get(case.name)) is not None:
                e, eager, comp = r["estimate"], r["eager"], r["compiled"]
                lines.append(
                    f"| {case.name} | {device} | {e:.0f} | {eager:.0f} | {eager / e:.2f} | {comp:.0f} | {comp / e:.2f} "
                    f"| {comp / eager:.2f} | {r.get('eager_s', 0):.0f}, {r.get('compiled_s', 0):.0f} |"
                )
    return "\n".join(lines)


def compile_summary(compiled: dict) -> str:
    """Per device: the range of the compiled / eager and measured / estimate ratios."""
    out = []
    for device, rows in compiled.get("rows", {}).items():
        if not rows:
            continue

        def span(xs: list[float]) -> str:
            return f"{min(xs):.2f}-{max(xs):.2f}"

        rs = list(rows.values())
        out.append(
            f"- {device}, {len(rs)} rows: compiled / eager {span([r['compiled'] / r['eager'] for r in rs])}; "
            f"measured / estimate eager {span([r['eager'] / r['estimate'] for r in rs])}, "
            f"compiled {span([r['compiled'] / r['estimate'] for r in rs])}"
        )
    return "\n".join(out)


def compile_section(compiled: dict) -> str:
    """The markdown section of ``--compile``'s record ("" before any)."""
    if not compiled.get("rows"):
        return ""
    when = "; ".join(f"{d}: {m}" for d, m in compiled.get("meta", {}).items())
    return f"""
## Under torch.compile

Script: `.venv/bin/python benchmarks/memory_model.py --compile`. Recorded: {when}.

Method: each of these rows trains twice in one run, eager and with OLMo-core's per-block
`torch.compile` (inductor, torch.compile's default backend: on CPU C++ kernels built with gcc).
olmx plans `torch.compile` only with CUDA and OLMo-core's train module applies it only where
CUDA is available, so on CPU the script puts `COMPILE_HOOK` in the workers: the train module
is asked to compile and OLMo-core's one CUDA check answers yes, so the blocks are compiled
where they are on a GPU (after activation checkpointing, before DDP/FSDP); OLMo-core's log says
it compiled, which the script checks. Each mode has its own baseline, the near-empty model run
the same way ({compiled.get("bases", "")}: compiling adds what dynamo and inductor keep
resident); each compiled run starts with an empty inductor cache. "measured" is MiB per
process above the baseline; on CPU the resident-set high-water mark, as above, which in a
compiled run also holds what compiling this model left resident beyond the baseline's. Run
time: the whole `olmx train` (2 steps, compiling included; bf16 is slow here, this CPU has no
bf16 instructions).

{compile_table(compiled)}

{compile_summary(compiled)}

The compiled peaks are lower, as expected from AOTAutograd's min-cut partitioner (inductor's
default), which saves fewer tensors for backward and recomputes cheap element-wise work (norms,
SiLU, casts) there, and from inductor fusing what eager keeps as separate tensors (not broken
down here). The memory model counts what eager mode saves (its constants were fitted on eager
runs), so for these rows compiled (compiling is the GPU default) its estimate is that much above
the peak: on the safe side for the fit checks, pessimistic for `auto`'s choices. These rows have
no QK-norm, which OLMo 3's blocks have (its float32 copies in bf16 without autocast are counted
since tests/plan/test_layouts_at_scale.py measured them); that case is not measured compiled. Not
measured on a GPU yet.
"""


def write(record: dict, meta: dict, out: Path, compiled: dict | None = None) -> None:
    """``memory_model.json`` (raw) and ``memory_model.md`` (the record collect_results.py reads);
    ``compiled``: ``--compile``'s record (kept as recorded when None)."""
    previous = out / "memory_model.json"
    if compiled is None and previous.exists():
        compiled = json.loads(previous.read_text()).get("compile")
    data = {"meta": meta, "rows": record, **({"compile": compiled} if compiled else {})}
    (out / "memory_model.json").write_text(json.dumps(data, indent=1) + "\n")
    when = "; ".join(f"{d}: {m}" for d, m in meta.items())
    text = f"""# Memory: the plan's estimate against measured peaks, across strategies

Script: `benchmarks/memory_model.py` (`.venv/bin/python benchmarks/memory_model.py`; it writes
this file). Recorded: {when}.

Method: each configuration trains 2 steps with `olmx train` (real processes, gloo on CPU,
eager, OLMo-core's SkipStepAdamW, one micro-batch per step; step 2 is the first whose backward
pass has the optimizer state). Measured: the largest `peak_mem_mib` of any process in
`summary.json`; on CPU the resident-set high-water mark minus that of a near-empty model run
the same way (the interpreter, torch, OLMo-core, the data loader), with glibc told to serve
allocations above 64 KiB with mmap (`MALLOC_MMAP_THRESHOLD_=65536`) so that freed tensors leave
the process and resident memory follows the live tensors; on CUDA
`torch.cuda.max_memory_allocated` of a fresh process (live tensors too). Estimate: `olmx.plan.memory.estimate`
of the plan for the same overrides (what `olmx train --dry-run` prints under `memory`), for the
device it ran on; "state + buffers" is parameters, gradients, optimizer state and buffers. MiB
per process. Vocabulary 384 (byte-level, padded); "17M" = d_model 512, 4 blocks of 8 heads,
SwiGLU 2048; "135M" = d_model 1024, 8 blocks, SwiGLU 4096; MoE = 4 experts of SwiGLU 1024,
top-2, in every block; Engram = block 1, orders 2 and 3 x 8 heads x ~20k rows x 64 (20.5M
table parameters). "fitted": the estimate's constants were chosen on these rows (the tensor
counts themselves come from autograd's saved-tensor hooks on the OLMo-core, MoE and Engram
blocks; what the rows decided is in `olmx/plan/memory.py`: the backward transient, one copy of
optimizer temporaries, FSDP's two gathered blocks on CPU too, no DDP bucket, no Ulysses
all-to-all buffer at the peak); "held out": predicted, nothing was tuned on them.

{table(record)}

{summary(record)}

With glibc's default heap (no `MALLOC_MMAP_THRESHOLD_`), resident memory is not the live
tensors: freed activation blocks stay in the process. An earlier run of this script that way
(2026-12-02 04:16 UTC, same machine) measured, above the same baseline, 963 / 2955 / 1829 /
2952 / 2873 / 2242 / 772 / 1866 MiB for the first 8 rows above, 1.1-2.1x the live peaks here
(2.1x with full checkpointing, whose recompute churns the heap most), and varied by up to 20%
between runs (the 2-process FSDP row: 1888 and 2242 MiB). The estimate is of live tensors: on
GPUs that is what `torch.cuda.max_memory_allocated` counts; CPU runs that must not exceed their
RAM can set `MALLOC_MMAP_THRESHOLD_=65536` for the workers.
{compile_section(compiled or {})}"""
    (out / "memory_model.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="Run only the configurations whose name contains one of these.")
    parser.add_argument("--keep", type=Path, help="Keep the run directories here.")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Where memory_model.{md,json} go.")
    parser.add_argument(
        "--estimate-only",
        action="store_true",
        help="Recompute the estimates of the recorded rows (after a change to the memory model); measure nothing.",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="Measure COMPILE_ROWS (or the --only rows) eager and under torch.compile (inductor), side by side.",
    )
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="olmx-memory-"))
    previous = args.out / "memory_model.json"
    saved = json.loads(previous.read_text()) if previous.exists() else {"meta": {}, "rows": {}}
    record, meta = saved["rows"], saved["meta"]
    if args.estimate_only:
        for device, rows in [*record.items(), *saved.get("compile", {}).get("rows", {}).items()]:
            for i, case in enumerate(CASES):
                if case.name in rows and (est := estimate_run(case.args, root / f"e{i}"))[0] == device:
                    rows[case.name].update(est[1])  # (rows of another device keep theirs)
        print(table(record), summary(record), compile_table(saved.get("compile", {})), sep="\n\n")
        write(record, meta, args.out, saved.get("compile"))
        return
    if args.compile:
        measure_compiled(args, root, saved)
        return
    n_gpus = gpus()
    device = "cuda" if n_gpus else "cpu"
    rows = record[device] = record.get(device, {}) if args.only else {}
    base = measured_mib([*COMMON, *BASE], root / "base") if device == "cpu" else 0.0
    print(f"device {device}; baseline (near-empty model): {base:.0f} MiB\n")
    start = time.time()
    earlier = meta.get(device) if args.only else None
    for i, case, est in runnable(lambda name: not args.only or any(p in name for p in args.only), n_gpus, root):
        got = measured_mib(case.args, root / f"m{i}") - base
        rows[case.name] = {**est, "measured": got}
        print(
            f"{case.name:50} {'fitted' if case.fitted else 'held out':8} state {est['state']:6.0f}  "
            f"acts {est['activations']:6.0f}  estimate {est['estimate']:6.0f}  measured {got:6.0f}  "
            f"ratio {got / est['estimate']:.2f}",
            flush=True,
        )
        run = f"{machine(start)}, baseline {base:.0f} MiB, {time.time() - start:.0f} s" + (
            f" (rows matching {args.only})" if args.only else ""
        )
        meta[device] = f"{earlier}; then {run}" if earlier else run
        write(record, meta, args.out)  # after every row: a failed run keeps what it measured
    print()
    print(table(record))
    print()
    print(summary(record))


def measure_compiled(args: argparse.Namespace, root: Path, saved: dict) -> None:
    """``--compile``: each chosen row eager, then compiled (:data:`COMPILE_HOOK` on CPU,
    ``trainer.compile=true`` on CUDA), recorded in ``saved["compile"]``."""
    n_gpus = gpus()
    device = "cuda" if n_gpus else "cpu"
    compiled = saved.setdefault("compile", {})
    rows = compiled.setdefault("rows", {}).setdefault(device, {})
    env = compile_env(root) if device == "cpu" else None

    def compiling(case_args: list[str]) -> list[str]:
        return case_args if env is not None else [*case_args, "trainer.compile=true"]

    start = time.time()
    if device == "cpu":
        base = measured_mib([*COMMON, *BASE], root / "base")
        base_c = measured_mib([*COMMON, *BASE], root / "base-c", env)
    else:
        base = base_c = 0.0
    print(f"device {device}; baselines (near-empty model): eager {base:.0f} MiB, compiled {base_c:.0f} MiB\n")

    def chosen(name: str) -> bool:
        return any(p in name for p in args.only) if args.only else name in COMPILE_ROWS

    for i, case, est in runnable(chosen, n_gpus, root):
        t0 = time.time()
        eager = measured_mib(case.args, root / f"m{i}") - base
        t1 = time.time()
        comp = measured_mib(compiling(case.args), root / f"c{i}", env) - base_c
        rows[case.name] = {**est, "eager": eager, "compiled": comp, "eager_s": t1 - t0, "compiled_s": time.time() - t1}
        print(
            f"{case.name:50} estimate {est['estimate']:6.0f}  eager {eager:6.0f} ({eager / est['estimate']:.2f})  "
            f"compiled {comp:6.0f} ({comp / est['estimate']:.2f})  {t1 - t0:.0f} s / {time.time() - t1:.0f} s",
            flush=True,
        )
        compiled.setdefault("meta", {})[device] = (
            f"{machine(start)}, {time.time() - start:.0f} s, torch {torch_version()}"
        )
        compiled["bases"] = f"{device}: eager {base:.0f} MiB, compiled {base_c:.0f} MiB"
        write(saved["rows"], saved["meta"], args.out, compiled)  # after every row
    print()
    print(compile_table(compiled))


def runnable(wanted: Callable[[str], bool], n_gpus: int, root: Path) -> Iterator[tuple[int, Case, dict[str, float]]]:
    """``(index, case, plan estimate)`` of the :data:`CASES` that ``wanted`` picks by name and
    this machine can run (on CUDA: those that need no more GPUs than it has; the rest are
    reported skipped)."""
    device = "cuda" if n_gpus else "cpu"
    for i, case in enumerate(CASES):
        if not wanted(case.name):
            continue
        if device == "cuda" and case.nproc > n_gpus:
            print(f"{case.name}: skipped ({case.nproc} processes, {n_gpus} GPU(s))")
            continue
        plan_device, est = estimate_run(case.args, root / f"e{i}")
        assert plan_device == device, (plan_device, device)
        yield i, case, est


def machine(start: float) -> str:
    """When a measurement started and on what: the record's provenance line."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(start))} UTC, {platform.node() or 'this machine'}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


def torch_version() -> str:
    """torch's version, without importing torch into this process."""
    from importlib.metadata import version

    return version("torch")


if __name__ == "__main__":
    main()
