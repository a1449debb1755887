"""The GPU smoke run of olmx: what one GPU machine can tell about olmx in under 8 minutes.

``benchmarks/gpu/smoke.sh`` starts it (its header says how). A fixed sequence of steps, most
informative first, under a hard budget (``--deadline``, an epoch second: smoke.sh's start plus
465 s on the device). Every step gets its own time box cut from what is left (at most the step's
own allowance, and the step is skipped when less than its minimum is left), every process a
step starts is killed when its box runs out, and each step appends its result line to
``OUT/steps.jsonl`` the moment it ends, so a run cut short still reports what ran. SIGTERM (the
outer ``timeout``) reports the step in flight and the ones left as ``cut`` before exiting.

1. ``install``: the wheels ``benchmarks/gpu/wheels.sh`` prepared (``--wheels``, default
   ``.whl/``) into a folder under the scratch folder with ``pip install --no-index --no-deps
   --target`` (unzipped where the interpreter has no pip). Every later step runs this same
   interpreter (the image's own ``python3``: a venv made from a venv sees its base's packages,
   not the venv's torch) with that folder on ``PYTHONPATH``. Only wheels that fit the
   interpreter go in (a wheel built for another Python fails the step, named, with the command
   that builds the right ones), and protobuf only where the interpreter's own is outside the
   range OLMo-core's import chain needs (:data:`CARRIED_IF_OLDER`);
2. ``olmx``: ``python -m olmx plugins list`` (olmx finds its plugins through entry points, so
   this shows the install is whole) and the stdlib corpus tokenized once for the runs;
3. ``environment``: driver, GPU, compute capability, versions, free disk, and which SDPA kernel
   runs a causal attention (bf16 on CUDA), with ``is_causal`` and with an explicit mask (what
   a sliding window makes OLMo-core pass), each kernel also forced in turn; and whether what
   the runs import imports (:data:`REQUIRED_IMPORTS`): where one does not, the step fails with
   its error and the runs are reported skipped with it (each would fail on the same import);
4. ``30m <path>``: ``model=olmo3_30m`` through every path at once (concurrent processes on the
   one GPU: pass/fail checks, not speeds): bf16 ddp (eager), bf16 fsdp+compile (also with
   OLMo 3 32B's ``trainer.activation_checkpointing=budget``), fp8 tensorwise
   and rowwise under fsdp, mxfp8 (SM100 only), MoE portable and olmo_core, Engram with 1d
   sharding; first and last loss, graph breaks and recompiles (``TORCH_LOGS=graph_breaks,
   recompiles`` lines in the node log; ``n/a`` where the run is not compiled);
5. ``1b``: ``model=olmo3_1b parallel=[fsdp]`` with the fast defaults (bf16, compile on), 40
   steps: start-up, time to first step, tokens/s over the steps after the first logged ones,
   MFU against olmx's peak table (:func:`olmx.launch.devices.peak_flops`), peak allocated
   memory, the most ``nvidia-smi`` saw used, and the run's one checkpoint (its final save), timed;
6. ``1b olmo-core``: OLMo-core alone on the same model and batch
   (``benchmarks/handwritten_train.py --olmo3-1b``), stopped after its last step (its final
   save is not waited for), and the tokens/s ratio olmx / OLMo-core.

Held-out evaluation is off in every run (``eval.interval=0``: evaluating at the last step
recompiles), checkpoints only at the end (``trainer.save_interval`` beyond the run; olmx always
saves a final one), run directories under the scratch folder (``/tmp``, deleted once read).

``OUT`` gets four small files (the device returns at most 8 files of 16 MiB, 2 folders deep):
``steps.jsonl`` (a ``plan`` line naming the steps, then one line per step), ``summary.md`` (the
human-readable table, rewritten after every step), ``progress.log`` (when each step started,
with its box) and ``failures.txt`` (the output tails of failed steps).

``--rehearse`` runs the same install and sequence on a CPU at tiny sizes (``model=tiny``, a few
steps; a path that needs CUDA is reported ``skipped`` with the reason; fp8 tensorwise runs
torchao's emulation). ``--plan-only`` installs nothing and plans every run (``olmx train
--dry-run`` for ``--gpu-name``) with this interpreter's olmx.

    python benchmarks/gpu/smoke.py --out DIR [--rehearse | --plan-only [--gpu-name NAME]]
        [--deadline EPOCH | --budget S] [--wheels DIR] [--scratch DIR]

Only the standard library is imported here (and pyyaml, which the image has, to read plans, and
olmx's peak table from the install); what needs torch runs in the steps' processes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
#: Environment variable every process of a step inherits (its value names the step's process
#: tree), so that a step's processes can be found and killed even where they start sessions of
#: their own (olmx's launcher starts torchrun, and torchrun its workers, in new sessions).
MARK = "OLMX_SMOKE_PROC"
#: Seconds kept back at the end of the budget for the last lines and the summary.
RESERVE = {"gpu": 5, "rehearse": 3, "plan": 3}
#: Default budgets (seconds) where no ``--deadline`` is given.
BUDGET = {"gpu": 465, "rehearse": 150, "plan": 240}

#: Every ``olmx train`` of the sequence: built-in data, one process, no evaluation, no report,
#: no checkpoint but the final one, never resumed.
COMMON = [
    "data=stdlib",
    "eval.interval=0",
    "trainer.report=false",
    "trainer.save_interval=100000",
    "trainer.resume=false",
    "infra.nproc_per_node=1",
]
#: The 30M runs (GPU) and their tiny stand-ins (rehearsal).
SMALL = {
    "gpu": [
        "model=olmo3_30m",
        "data.seq_len=1024",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=8",
        "trainer.max_steps=20",
        "trainer.warmup_steps=2",
        "trainer.log_interval=1",
    ],
    "rehearse": [
        "model=tiny",
        "data.seq_len=64",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2",
        "trainer.max_steps=3",
        "trainer.warmup_steps=1",
    ],
}
#: The 1B run (GPU; metrics every 10 steps, as OLMo-core's scripts and olmx's CUDA default)
#: and its tiny stand-in.
BIG = {
    "gpu": [
        "model=olmo3_1b",
        "parallel=[fsdp]",
        "data.seq_len=4096",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=4",
        "trainer.max_steps=40",
        "trainer.warmup_steps=5",
    ],
    "rehearse": [
        "model=tiny",
        "parallel=[fsdp]",
        "data.seq_len=64",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2",
        "trainer.max_steps=6",
        "trainer.warmup_steps=1",
    ],
}
#: ``benchmarks/handwritten_train.py`` arguments: the 1B model and batch of :data:`BIG`, and in
#: rehearsal its default tiny model (DDP) at the rehearsal's sizes.
OLMO_CORE = {
    "gpu": ["--olmo3-1b", "--seq-len", "4096", "--global-seqs", "8", "--micro-seqs", "4", "--steps", "40"]
    + ["--warmup", "5"],
    "rehearse": ["--seq-len", "64", "--global-seqs", "4", "--micro-seqs", "2", "--steps", "6", "--warmup", "1"],
}


@dataclass(frozen=True)
class Variant:
    """One path of the 30M model."""

    name: str
    overrides: tuple[str, ...]
    #: Compute capability the path needs.
    min_cc: tuple[int, int] = (8, 0)
    #: On CPUs (rehearsal): None runs the same overrides, a string is why it is skipped, a
    #: tuple adds overrides.
    cpu: str | tuple[str, ...] | None = None


VARIANTS = (
    Variant("bf16 ddp", ("precision=bf16", "parallel=[ddp]", "trainer.compile=false")),
    Variant(
        "bf16 fsdp+compile",
        ("precision=bf16", "parallel=[fsdp]", "trainer.compile=true"),
        cpu="needs CUDA: OLMo-core 3.0.0 compiles only on CUDA",
    ),
    Variant(  # OLMo 3 32B's checkpointing (its script's mode=budget, 0.5): the compiler's partitioner
        "bf16 fsdp+compile budget",
        ("precision=bf16", "parallel=[fsdp]", "trainer.compile=true", "trainer.activation_checkpointing=budget"),
        cpu="needs CUDA: budget checkpointing is torch.compile's, and OLMo-core 3.0.0 compiles only on CUDA",
    ),
    Variant(
        "fp8 tensorwise fsdp",
        ("precision=fp8", "precision.recipe=tensorwise", "parallel=[fsdp]"),
        (8, 9),
        cpu=("precision.emulate=true",),
    ),
    Variant(
        "fp8 rowwise fsdp",
        ("precision=fp8", "precision.recipe=rowwise", "parallel=[fsdp]"),
        (9, 0),
        cpu="needs CUDA: torchao's rowwise float8 kernels (SM90)",
    ),
    Variant("mxfp8 fsdp", ("precision=mxfp8", "parallel=[fsdp]"), (10, 0), cpu="needs CUDA: MXFP8 kernels (SM100)"),
    Variant("moe portable", ("layers=[moe]", "layers.moe.backend=portable")),
    Variant(
        "moe olmo_core",
        ("layers=[moe]", "layers.moe.backend=olmo_core"),
        cpu="needs CUDA: OLMo-core's MoE kernels (layers.moe.backend=olmo_core)",
    ),
    Variant("engram 1d", ("layers=[engram]", "layers.engram.sharding=1d", "parallel=[fsdp]")),
)

#: (allowance, minimum) seconds of each step by mode; None: all that is left.
BOXES: dict[str, dict[str, tuple[float | None, float]]] = {
    "gpu": {
        "install": (60, 10),
        "olmx": (60, 10),
        "environment": (60, 10),
        "30m": (170, 45),
        "1b": (200, 90),
        "1b olmo-core": (None, 90),
    },
    "rehearse": {
        "install": (35, 5),
        "olmx": (30, 5),
        "environment": (35, 5),
        "30m": (75, 20),
        "1b": (45, 15),
        "1b olmo-core": (40, 15),
    },
    "plan": {"30m": (150, 10), "1b": (60, 10)},
}


#: Plugins the sequence uses: ``olmx plugins list`` must show them.
EXPECTED_PLUGINS = {"moe", "engram", "ddp", "fsdp", "bf16", "fp8", "auto", "local"}
#: Carried wheels installed only where the interpreter lacks the distribution or has it outside
#: [lowest, first excluded): protobuf, because OLMo-core's import of ``olmo_core.train`` and
#: ``olmo_core.io`` goes through cached_path -> google-api-core -> googleapis-common-protos 1.76,
#: whose generated modules need protobuf >=6.33.5,<8 (an image's older one fails that import),
#: while a fitting one of the image stays what its other packages were installed with.
CARRIED_IF_OLDER: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {"protobuf": ((6, 33, 5), (8,))}
#: What the runs import, checked by the environment probe: olmx, and the OLMo-core modules whose
#: import chain reaches the carried Google packages (``olmo_core`` alone imports without them).
REQUIRED_IMPORTS = ("olmx", "olmo_core", "olmo_core.train", "olmo_core.io")


class Cut(Exception):
    """SIGTERM: the outer time limit (smoke.sh's ``timeout``) ran out."""


# --------------------------------------------------------------------------- processes

_ids = itertools.count(1)
ACTIVE: set[Proc] = set()


def kill_marked(token: str) -> int:
    """SIGKILL every process that carries ``MARK=token`` in its environment; how many."""
    needle, killed = f"{MARK}={token}".encode(), 0
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


class Proc:
    """One command of a step: its own session, its output in ``log``, and the step's marker in the
    environment of everything it starts (:func:`kill_marked`)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], cwd: Path) -> None:
        self.token = f"{os.getpid()}-{next(_ids)}"
        self.log = log
        self.start = time.time()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            self.popen = subprocess.Popen(
                args,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env={**env, MARK: self.token},
                start_new_session=True,
            )
        ACTIVE.add(self)
        self.code: int | None = None

    def poll(self) -> int | None:
        """The exit status once it ended (None while it runs)."""
        if self.code is None:
            self.code = self.popen.poll()
        return self.code

    def kill(self, *, quick: bool = False) -> None:
        """Kill the command and everything it started (twice, for what was being started the
        first time, unless ``quick``) and reap the command."""
        for attempt in range(1 if quick else 2):
            if attempt:
                time.sleep(0.2)
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except OSError:
                pass
            kill_marked(self.token)
        try:
            self.popen.wait(timeout=1 if quick else 10)
        except subprocess.TimeoutExpired:
            pass
        ACTIVE.discard(self)

    def output(self, chars: int) -> str:
        """The last ``chars`` characters of its output."""
        return tail(self.log, chars)


def tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a text file ('' where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * chars))
            return f.read().decode("utf-8", "replace")[-chars:]
    except OSError:
        return ""


def wait_all(
    procs: dict[str, Proc],
    deadline: float,
    done: Callable[[str, Proc, int, str | None], None],
    stop_when: Callable[[str], bool] | None = None,
) -> None:
    """Wait for every command until ``deadline``; ``done(name, proc, code, note)`` the moment each
    ends (code 124 where its box ran out, killed; ``stop_when(name)`` true ends it early, killed,
    with code 0 and a note)."""
    left = dict(procs)
    while left:
        for name, proc in list(left.items()):
            code, note = proc.poll(), None
            if code is None and stop_when is not None and stop_when(name):
                proc.kill()
                code, note = 0, "stopped after its last step (its final save not waited for)"
            elif code is None and time.time() >= deadline:
                proc.kill()
                code, note = 124, f"timed out: killed after {time.time() - proc.start:.0f} s (its box)"
            if code is not None:
                proc.kill()  # leftovers (compile workers, a stray torchrun) go with it
                del left[name]
                done(name, proc, code, note)
        if left:
            time.sleep(0.25)


def run_one(args: list[str], log: Path, env: dict[str, str], cwd: Path, box: float) -> tuple[int, float, str | None]:
    """One command in a box: (exit status or 124, seconds, note)."""
    proc = Proc(args, log, env, cwd)
    out: list[tuple[int, str | None]] = []
    wait_all({"x": proc}, time.time() + box, lambda _n, _p, code, note: out.append((code, note)))
    return out[0][0], round(time.time() - proc.start, 1), out[0][1]


# --------------------------------------------------------------------------- report


class Report:
    """``steps.jsonl`` (appended and synced per line), ``progress.log``, ``failures.txt`` and
    ``summary.md`` (rewritten after every line) in ``out``."""

    def __init__(self, out: Path, mode: str, started: float, deadline: float) -> None:
        self.out, self.mode, self.started, self.deadline = out, mode, started, deadline
        out.mkdir(parents=True, exist_ok=True)
        for name in ("steps.jsonl", "summary.md", "progress.log", "failures.txt"):
            (out / name).unlink(missing_ok=True)
        self.records: list[dict[str, Any]] = []
        self.planned: list[str] = []
        self.reported: set[str] = set()

    def _append(self, name: str, text: str) -> None:
        with open(self.out / name, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def plan(self, steps: list[str], **info: Any) -> None:
        """The first line: the steps to come and the budget."""
        self.planned = steps
        budget = round(self.deadline - self.started)
        line = {"step": "plan", "mode": self.mode, "steps": steps, "budget_s": budget, **info}
        self._append("steps.jsonl", json.dumps(line) + "\n")
        self.info = info

    def begin(self, name: str, box: float) -> None:
        """A step starts (``progress.log``)."""
        self._append("progress.log", f"{time.time() - self.started:7.1f} s  start {name} (box {box:.0f} s)\n")

    def result(self, record: dict[str, Any]) -> None:
        """A step's line, the moment it ended."""
        long_tail = record.pop("failure_output", None)
        record["at_s"] = round(time.time() - self.started, 1)
        self.records.append(record)
        self.reported.add(record["step"])
        self._append("steps.jsonl", json.dumps(record, default=str) + "\n")
        end = f"{record['at_s']:7.1f} s  {record['status']:7} {record['step']}"
        self._append("progress.log", end + (f": {record['note']}" if record.get("note") else "") + "\n")
        if long_tail and record["status"] in ("fail", "timeout"):
            self._append("failures.txt", f"===== {record['step']} ({record['status']}) =====\n{long_tail[-6000:]}\n\n")
        self.summary()

    def skip(self, name: str, why: str) -> None:
        """A step not run."""
        self.result({"step": name, "status": "skipped", "note": why})

    def summary(self) -> None:
        """``summary.md``: what ran, one row per step."""
        used = time.time() - self.started
        title = {"gpu": "GPU", "rehearse": "CPU rehearsal", "plan": "plans only"}[self.mode]
        lines = [
            f"# olmx GPU smoke ({title}), {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.started))}",
            "",
            f"budget {self.deadline - self.started:.0f} s, used {used:.0f} s; "
            + ", ".join(f"{k} {v}" for k, v in getattr(self, "info", {}).items()),
            "",
        ]
        for r in self.records:
            if r["step"] == "environment" and r["status"] == "pass":
                lines += [environment_line(r), ""]
        lines += [
            "| step | status | s (box) | loss first -> last | tokens/s | MFU | peak MiB | breaks / recompiles | note |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.records:
            plan = "; ".join(f"{k[5:].replace('_', ' ')}: {v}" for k, v in r.items() if k.startswith("plan_"))
            note = r.get("note") or (f"plan: {plan}" if plan else "")
            loss = f"{fmt(r.get('first_loss'))} -> {fmt(r.get('last_loss'))}" if r.get("first_loss") is not None else ""
            gb = f"{r['graph_breaks']} / {r['recompiles']}" if "graph_breaks" in r else ""
            mfu = f"{100 * r['mfu']:.1f}%" if isinstance(r.get("mfu"), float) else ""
            box = f" ({r['box_s']:.0f})" if r.get("box_s") is not None else ""
            lines.append(
                f"| {r['step']} | {r['status']} | {fmt(r.get('seconds'))}{box} | {loss} | {fmt(r.get('tokens_per_s'))} "
                f"| {mfu} | {fmt(r.get('peak_mem_mib'))} | {gb} | {one_line(note)} |"
            )
        for r in self.records:
            if r["step"] == "1b" and r.get("steps"):
                lines += ["", big_line(r)]
            if r["step"] == "1b olmo-core" and r.get("ratio"):
                lines += ["", f"olmx / OLMo-core tokens/s: {r['ratio']:.3f}"]
        missing = [s for s in self.planned if s not in self.reported]
        if missing:
            lines += ["", "not reported (yet): " + ", ".join(missing)]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")


def fmt(value: Any) -> str:
    """A number for the table."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def one_line(text: str, chars: int = 160) -> str:
    """A note for a table cell."""
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= chars else text[: chars - 3] + "..."


def environment_line(r: dict[str, Any]) -> str:
    """The environment in one paragraph."""
    keys = ("gpu", "capability", "driver", "python", "torch", "cuda", "triton", "olmo_core", "torchao")
    keys += ("transformers", "protobuf", "torchao_cpp_extensions", "free_disk_scratch_gib", "cpus")
    text = "environment: " + ", ".join(f"{k}={r.get(k)}" for k in keys if k in r)
    for name, error in (r.get("import_errors") or {}).items():
        text += f"; `import {name}` fails: {error}"
    sdpa = r.get("sdpa") or {}
    for case in ("causal", "mask"):
        s = sdpa.get(case)
        if s:
            forced = s.get("forced", {}).items()
            kernels = ", ".join(f"{k} {v if not v.startswith('refused') else 'refused'}" for k, v in forced)
            text += f"; SDPA {case} ({sdpa.get('dtype')}): default runs {s.get('default')} (forced: {kernels})"
    return text


def big_line(r: dict[str, Any]) -> str:
    """The 1B figures in one paragraph."""
    parts = [
        ("startup_s", "start-up {} s"),
        ("time_to_first_step_s", "first step after ~{} s"),
        ("tokens_per_s", "{} tokens/s over steps " + str(r.get("window"))),
        ("mfu", "MFU {} (olmx's peak table)"),
        ("mfu_reported", "MFU reported by the run {}"),
        ("peak_mem_mib", "peak allocated {} MiB"),
        ("reserved_mem_mib", "peak reserved {} MiB"),
        ("gpu_mem_used_max_mib", "nvidia-smi max used {} MiB"),
        ("gpu_util_mean", "GPU utilisation {}% (mean of busy samples)"),
        ("save_s", "checkpoint save {} s"),
        ("checkpoint_gib", "of {} GiB"),
    ]
    shown = [
        text.format(f"{100 * r[key]:.1f}%" if key.startswith("mfu") and isinstance(r[key], float) else fmt(r[key]))
        for key, text in parts
        if r.get(key) is not None
    ]
    return "1b: " + ", ".join(shown)


# --------------------------------------------------------------------------- reading runs


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (a torn last line skipped)."""
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return out


def window_rate(records: list[dict[str, Any]], tokens_per_step: float | None, warm_step: int) -> dict[str, Any]:
    """Tokens/s between the first logging instant at or after ``warm_step`` and the last one.

    OLMo-core hands a log interval's records over at once, so their ``time`` fields bunch: the
    rate is taken between the last records of two such instants (any instants: a window, not
    a mean of per-step rates)."""
    ends: list[dict[str, Any]] = []
    for r in records:
        if r.get("time") is None or r.get("step") is None:
            continue
        if ends and r["time"] - ends[-1]["time"] < 0.05:
            ends[-1] = r
        else:
            ends.append(r)
    after = [e for e in ends if e["step"] >= warm_step]
    if len(after) < 2:
        return {}
    a, b = after[0], after[-1]
    if b["time"] <= a["time"]:
        return {}

    def tokens(r: dict[str, Any]) -> float:
        return r["tokens"] if r.get("tokens") is not None else r["step"] * (tokens_per_step or 0)

    rate = (tokens(b) - tokens(a)) / (b["time"] - a["time"])
    return {
        "tokens_per_s": round(rate, 1),
        "window": f"{a['step']}-{b['step']}",
        "step_s": (b["time"] - a["time"]) / (b["step"] - a["step"]),
        "first_log": ends[0],
    }


def read_plan(run_dir: Path) -> dict[str, Any]:
    """What the saved plan says about the run (compile, attention, FLOPs per token, device)."""
    try:
        import yaml

        plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    except Exception:  # noqa: BLE001 - no plan (a run that failed to plan), or no pyyaml
        return {}
    execution = plan.get("execution") or {}
    out: dict[str, Any] = {"compile": execution.get("compile"), "dtype": (plan.get("dtypes") or {}).get("param")}
    out["device_name"] = (plan.get("world") or {}).get("device_name")
    for note in execution.get("notes") or []:
        if str(note).startswith("attention"):
            out["attention"] = note
    for row in (plan.get("sections") or {}).get("time") or []:
        m = re.search(r"without recompute: ([\d.,]+) ([MG])", " ".join(map(str, row)))
        if m:
            out["flops_per_token"] = float(m.group(1).replace(",", "")) * (1e9 if m.group(2) == "G" else 1e6)
    for row in (plan.get("sections") or {}).get("memory") or []:
        if row and row[0] == "estimated peak":
            out["plan_peak"] = row[1]
    batch = plan.get("batch") or {}
    if batch.get("seq_len") and batch.get("global_seqs"):
        out["tokens_per_step"] = batch["seq_len"] * batch["global_seqs"]
    return out


_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)"


def compile_counts(text: str) -> dict[str, Any]:
    """Graph breaks and recompiles in a log written with ``TORCH_LOGS=graph_breaks,recompiles``
    (and hits of dynamo's recompile limit, which it warns about anyway)."""
    out: dict[str, Any] = {
        "graph_breaks": len(re.findall(r"Graph break (?:in user code|\(user stack suppressed)", text)),
        "recompiles": len(re.findall(r"Recompiling function", text)),
    }
    limit = len(re.findall(r"recompile_limit|cache_size_limit", text))
    if limit:
        out["recompile_limit_hits"] = limit
    return out


def read_node_log(run_dir: Path) -> dict[str, Any]:
    """Graph breaks, recompiles and the last checkpoint save's seconds from the node log."""
    try:
        text = (run_dir / "logs" / "node0.log").read_text(errors="replace")
    except OSError:
        return {}
    out = compile_counts(text)
    saves = re.findall(_STAMP + r".*Saving checkpoint for step (\d+)", text)
    saved = re.findall(_STAMP + r".*Checkpoint saved", text)
    if saves and saved:
        from datetime import datetime

        parse = lambda s: datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f").timestamp()  # noqa: E731
        out["save_s"] = round(parse(saved[-1]) - parse(saves[-1][0]), 2)
        out["save_step"] = int(saves[-1][1])
    return out


def dir_gib(path: Path) -> float | None:
    """Size of a folder's files in GiB."""
    if not path.is_dir():
        return None
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return round(total / 2**30, 3)


def read_olmx_run(run_dir: Path, proc_start: float) -> dict[str, Any]:
    """The figures of one ``olmx train`` run directory (whatever exists, also of a cut run)."""
    plan = read_plan(run_dir)
    records = [r for r in jsonl(run_dir / "metrics.jsonl") if r.get("loss") is not None]
    out: dict[str, Any] = {k: plan.get(k) for k in ("compile", "attention", "plan_peak")}
    if records:
        last_step = records[-1]["step"]
        win = window_rate(records, plan.get("tokens_per_step"), max(2, last_step // 4))
        out.update(
            steps=last_step,
            first_loss=round(records[0]["loss"], 4),
            last_loss=round(records[-1]["loss"], 4),
            tokens_per_s=win.get("tokens_per_s"),
            window=win.get("window"),
            tokens_per_s_reported=records[-1].get("tokens_per_s"),
            mfu_reported=records[-1].get("mfu"),
            peak_mem_mib=max((r.get("peak_mem_mib") or 0) for r in records) or None,
            reserved_mem_mib=max((r.get("reserved_mem_mib") or 0) for r in records) or None,
        )
        out["mfu"] = mfu(win.get("tokens_per_s"), plan)
        first = win.get("first_log") or records[0]
        out["first_logged_step"] = first["step"]
        out["first_logged_s"] = round(first["time"] - proc_start, 1)
        if win.get("step_s"):
            out["time_to_first_step_s"] = round(first["time"] - proc_start - (first["step"] - 1) * win["step_s"], 1)
        elif first["step"] == 1:
            out["time_to_first_step_s"] = out["first_logged_s"]
    start = [e for e in jsonl(run_dir / "events.jsonl") if e.get("event") == "start"]
    if start:
        out["startup_s"] = round(start[0]["time"] - proc_start, 1)
    log = read_node_log(run_dir)
    if not plan.get("compile"):
        log["graph_breaks"] = log["recompiles"] = "n/a (not compiled)"
    out.update(log)
    if log.get("save_step"):
        out["checkpoint_gib"] = dir_gib(run_dir / "checkpoints" / f"step{log['save_step']}")
    return {k: v for k, v in out.items() if v is not None}


def mfu(tokens_per_s: float | None, plan: dict[str, Any]) -> float | None:
    """Model FLOPs utilisation against olmx's peak table (None where either is unknown)."""
    if not tokens_per_s or not plan.get("flops_per_token") or not plan.get("device_name"):
        return None
    try:  # olmx from the install (on sys.path after the install step)
        from olmx.launch.devices import peak_flops
    except Exception:  # noqa: BLE001 - no MFU rather than no report
        return None
    dtype = "float32" if plan.get("dtype") == "float32" else "bfloat16"
    peak = peak_flops(plan["device_name"], dtype)
    return round(tokens_per_s * plan["flops_per_token"] / peak, 4) if peak else None


# --------------------------------------------------------------------------- the environment probe


def probe_environment(scratch: Path) -> dict[str, Any]:
    """What this interpreter and machine have (runs in the ``environment`` step's process);
    free disk where the run directories go (``scratch``)."""
    import importlib.metadata as md

    env: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for key, dist in (
        ("torch", "torch"),
        ("triton", "triton"),
        ("olmo_core", "ai2-olmo-core"),
        ("torchao", "torchao"),
        ("transformers", "transformers"),
        ("hydra", "hydra-core"),
        ("numpy", "numpy"),
        ("olmx", "olmx"),
        ("protobuf", "protobuf"),
        ("flash_attn", "flash-attn"),
        ("flash_attn_3", "flash-attn-3"),
    ):
        try:
            env[key] = md.version(dist)
        except md.PackageNotFoundError:
            env[key] = None
    for key, where in (("free_disk_scratch_gib", scratch), ("free_disk_repo_gib", REPO)):
        try:
            env[key] = round(shutil.disk_usage(where).free / 2**30, 1)
        except OSError:
            pass
    try:
        env["ram_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if shutil.which("nvidia-smi"):
        for query in ("name,driver_version,memory.total,memory.used,compute_cap,power.limit", "name,driver_version"):
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if smi.returncode == 0:
                break
        env["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[-300:]
        fields = [f.strip() for f in smi.stdout.splitlines()[0].split(",")] if smi.stdout.strip() else []
        if len(fields) >= 2:
            env["driver"] = fields[1]
    import torch

    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    cuda = torch.cuda.is_available()
    if cuda:
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        free, total = torch.cuda.mem_get_info()
        env["gpu_memory_gib"] = round(total / 2**30, 1)
        env["gpu_free_gib"] = round(free / 2**30, 1)
        env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
    else:
        env["gpu"] = None
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    env["imports"], env["import_errors"] = {}, {}
    for name in (*REQUIRED_IMPORTS, "torchao"):  # seconds each, cumulative: olmo_core.train after olmo_core
        start = time.time()
        try:
            __import__(name)
            env["imports"][name] = round(time.time() - start, 2)
        except Exception as exc:  # noqa: BLE001 - what failed is the finding
            env["import_errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
    if env.get("torchao") and cuda:
        try:  # torchao 0.15 loads its C++ extensions only for the torch it was built against
            env["torchao_cpp_extensions"] = torch._C._dispatch_has_kernel_for_dispatch_key(
                "torchao::mxfp8_quantize", "CUDA"
            )
        except (AttributeError, RuntimeError):
            env["torchao_cpp_extensions"] = False
    env["sdpa"] = probe_sdpa(cuda)
    return env


def probe_sdpa(cuda: bool) -> dict[str, Any]:
    """Which scaled-dot-product-attention kernel runs a causal attention: by default (the aten
    op the profiler sees) and each kernel forced (ms per call, or why it refused), with
    ``is_causal=True`` and with an explicit boolean causal mask."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    b, h, s, d = (2, 16, 2048, 128) if cuda else (1, 4, 256, 64)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
    mask = torch.ones(s, s, device=device, dtype=torch.bool).tril()
    cases = {"causal": {"is_causal": True}, "mask": {"attn_mask": mask}}
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    out: dict[str, Any] = {"shape": [b, h, s, d], "dtype": str(dtype).replace("torch.", "")}

    def timed(kwargs: dict[str, Any]) -> float:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            F.scaled_dot_product_attention(q, k, v, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        return round((time.perf_counter() - start) / 5 * 1000, 3)

    for case, kwargs in cases.items():
        result: dict[str, Any] = {"forced": {}}
        for name, backend in backends.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(backend):
                        result["forced"][name] = f"{timed(kwargs)} ms"
                except Exception as exc:  # noqa: BLE001 - a kernel that refuses says why (in its warnings)
                    why = list(dict.fromkeys(str(w.message).strip() for w in caught))  # torch's reasons
                    result["forced"][name] = "refused: " + one_line(" ".join(why) or str(exc) or "?", 300)
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            ops = [e.key for e in prof.key_averages() if "attention" in e.key and e.key.startswith("aten::_")]
            picked = [o for o in ops if o != "aten::_scaled_dot_product_attention"]
            result["default_op"] = picked[0] if picked else (ops[0] if ops else None)
            op = result["default_op"] or ""
            result["default"] = next((n for n in ("flash", "efficient", "cudnn", "math") if n in op), op or "?")
        except Exception as exc:  # noqa: BLE001
            result["default"] = f"unknown ({type(exc).__name__})"
        out[case] = result
    return out


# --------------------------------------------------------------------------- the steps


@dataclass
class Ctx:
    """What every step needs."""

    mode: str
    py: str
    out: Path
    scratch: Path
    wheels: Path
    gpu_name: str
    report: Report
    deadline: float
    site: Path | None = None
    cc: tuple[int, int] | None = None
    #: Why no run can work here (a module the runs import does not import), once known.
    unusable: str | None = None

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    def left(self) -> float:
        """Seconds left for steps."""
        return self.deadline - time.time() - RESERVE[self.mode]

    def box(self, step: str) -> float | None:
        """The step's time box, or None (reported skipped) where less than its minimum is left."""
        want, floor = BOXES[self.mode][step]
        left = self.left()
        box = left if want is None else min(want, left)
        return box if box >= floor else None

    def env(self, **more: str) -> dict[str, str]:
        """The environment of a step's processes: the install on ``PYTHONPATH``; never the
        working directory first on the import path (the tree's ``olmx/`` is not the install)."""
        env = dict(os.environ)
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.site), env.get("PYTHONPATH", "")) if p)
        env.update(PYTHONSAFEPATH="1", PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", TERM="dumb")
        if self.mode == "rehearse":  # concurrent runs share few cores: idle OpenMP threads sleep, not spin
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if not os.access(Path.home(), os.W_OK) and not env.get("OLMX_CACHE_DIR"):
            env["OLMX_CACHE_DIR"] = str(self.scratch / "cache")
        env.update(more)
        return env

    @property
    def cwd(self) -> Path:
        path = self.scratch / "cwd"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def begin(self, step: str) -> float | None:
        """The box of a step about to start (reported skipped where none)."""
        box = self.box(step)
        if box is None:
            _, floor = BOXES[self.mode][step]
            self.report.skip(step, f"out of budget: {max(0, self.left()):.0f} s left, needs {floor:.0f} s")
        else:
            self.report.begin(step, box)
        return box


def step_record(name: str, code: int, seconds: float, box: float, note: str | None, output: str) -> dict[str, Any]:
    """A step's line from its command's outcome."""
    status = "pass" if code == 0 else ("timeout" if code == 124 else "fail")
    record: dict[str, Any] = {"step": name, "status": status, "exit": code, "seconds": seconds, "box_s": round(box)}
    if note:
        record["note"] = note
    if status != "pass":
        record["tail"] = output[-800:]
        record["failure_output"] = output
        record.setdefault("note", first_error(output) or f"exit {code}")
    return record


def first_error(text: str) -> str | None:
    """The last line of an output that looks like an error."""
    for line in reversed(text.splitlines()):
        if re.search(r"(Error|Exception|error:|failed|FAILED)", line):
            return line.strip()[:300]
    return None


def unzip_wheels(wheels: list[Path], site: Path) -> None:
    """What ``pip install --no-deps --target`` does with wheels, for an interpreter without pip:
    unpack each, and move its ``*.data/purelib`` and ``platlib`` up (``scripts`` and ``data`` are
    not needed to import)."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    for data in site.glob("*.data"):
        for kind in ("purelib", "platlib"):
            for item in (data / kind).glob("*") if (data / kind).is_dir() else []:
                dest = site / item.name
                if dest.exists() and dest.is_dir():
                    shutil.copytree(item, dest, dirs_exist_ok=True)
                else:
                    shutil.move(str(item), dest)
        shutil.rmtree(data)


def interpreter_tags() -> set[str] | None:
    """The wheel tags this interpreter installs (``py3-none-any``, ``cp312-abi3-manylinux_2_28_x86_64``
    ...), from packaging (the image has it; pip carries a copy); None where neither is there."""
    try:
        from packaging import tags
    except ImportError:
        try:
            from pip._vendor.packaging import tags  # type: ignore[no-redef]
        except ImportError:
            return None
    return {str(tag) for tag in tags.sys_tags()}


def wheel_fits(wheel: str, supported: set[str]) -> bool:
    """Whether a wheel, by the tags in its file name (``name-version[-build]-py-abi-platform.whl``,
    each part possibly several joined by dots), installs on an interpreter supporting ``supported``."""
    py, abi, platform = wheel[: -len(".whl")].split("-")[-3:]
    return any(
        f"{p}-{a}-{pl}" in supported for p in py.split(".") for a in abi.split(".") for pl in platform.split(".")
    )


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version (``6.33.5`` -> (6, 33, 5), ``2.11.0+cu130`` -> (2, 11, 0))."""
    numbers = []
    for part in text.split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(numbers)


def select_wheels(
    wheels: list[Path], supported: set[str] | None, installed: Callable[[str], str | None]
) -> tuple[list[Path], list[str], dict[str, str]]:
    """The wheels to install: (those, the names of those that do not fit this interpreter, the
    :data:`CARRIED_IF_OLDER` distributions left to the interpreter's own fitting version).
    ``installed(name)`` is the interpreter's version of a distribution, or None."""
    chosen, unfit, kept = [], [], {}
    for wheel in wheels:
        if supported is not None and not wheel_fits(wheel.name, supported):
            unfit.append(wheel.name)
            continue
        dist = wheel.name.split("-")[0].lower()
        have = installed(dist) if dist in CARRIED_IF_OLDER else None
        lowest, excluded = CARRIED_IF_OLDER.get(dist, ((), ()))
        if have is not None and lowest <= version_tuple(have) < excluded:
            kept[dist] = have
            continue
        chosen.append(wheel)
    return chosen, unfit, kept


def installed_version(dist: str) -> str | None:
    """This interpreter's own version of a distribution (the install is not on its path here)."""
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def step_install(ctx: Ctx) -> None:
    """The carried wheels into ``SCRATCH/site`` (``--target``), on this interpreter: those that
    fit it, protobuf only where its own is outside the range needed (:func:`select_wheels`)."""
    box = ctx.begin("install")
    if box is None:
        return
    start = time.time()
    site = ctx.scratch / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    ctx.site = site
    wheels = sorted(ctx.wheels.glob("*.whl"))
    info: dict[str, Any] = {"wheels": len(wheels), "target": str(site)}
    try:
        info["built"] = json.loads((ctx.wheels / "BUILD_INFO.json").read_text())
        info["built"].pop("wheels", None)
    except (OSError, ValueError):
        pass
    if not wheels:
        out = f"no wheels in {ctx.wheels}: run `bash benchmarks/gpu/wheels.sh` first (on a machine with PyPI)"
        ctx.report.result({**step_record("install", 1, 0.0, box, out, out), **info})
        return
    wheels, unfit, kept = select_wheels(wheels, interpreter_tags(), installed_version)
    info["installed_wheels"] = len(wheels)
    if kept:
        info["interpreter_has"] = kept  # a carried wheel left out: the interpreter's own fits
    if unfit:
        info["unfit"] = unfit
    has_pip = subprocess.run([ctx.py, "-m", "pip", "--version"], capture_output=True, timeout=60, check=False)
    if has_pip.returncode == 0:
        info["installer"] = "pip"
        # --no-compile: a module is compiled when first imported (most of botocore never is)
        args = [ctx.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        args += ["--disable-pip-version-check", "--target", str(site), *map(str, wheels)]
        code, _, note = run_one(
            args, ctx.scratch / "logs" / "install.log", ctx.env(), ctx.cwd, box - (time.time() - start)
        )
        output = tail(ctx.scratch / "logs" / "install.log", 4000)
    else:
        info["installer"] = "unzip (no pip in this interpreter)"
        try:
            unzip_wheels(wheels, site)
            code, note, output = 0, None, ""
        except (OSError, zipfile.BadZipFile) as exc:
            code, note, output = 1, None, f"{type(exc).__name__}: {exc}"
    info["site_mib"] = round(sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 2**20, 1)
    if unfit and code == 0:  # the others are in, so that the next steps show what is missing
        here, built = "CPython %d.%d" % sys.version_info[:2], info.get("built", {}).get("python", "?")
        note = (
            f"{len(unfit)} wheels do not fit this interpreter ({here}; they were built for Python {built}), "
            f"left out: {', '.join(unfit)}; build them for it where PyPI is reachable: "
            f"PYTHON={ctx.py} bash benchmarks/gpu/wheels.sh"
        )
        code, output = 1, note
    ctx.report.result({**step_record("install", code, round(time.time() - start, 1), box, note, output), **info})


#: Tokenizes (once, into olmx's cache) the stdlib corpus every run trains on.
TOKENIZE = """
from olmx.config.schema import DataConfig
from olmx.data.files import token_files
print(token_files(DataConfig()))
"""


def step_olmx(ctx: Ctx) -> None:
    """``olmx plugins list`` from the install, and the stdlib corpus tokenized once."""
    box = ctx.begin("olmx")
    if box is None:
        return
    start, logs = time.time(), ctx.scratch / "logs"
    code, _, note = run_one([ctx.py, "-m", "olmx", "plugins", "list"], logs / "plugins.log", ctx.env(), ctx.cwd, box)
    listing = tail(logs / "plugins.log", 20000)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in listing.splitlines() if line.startswith("│")]
    plugins = {r[1]: r[3] for r in rows if len(r) >= 4 and r[1]}
    info: dict[str, Any] = {
        "plugins": sorted(plugins),
        "not_available": {k: v for k, v in plugins.items() if v != "available"},
    }
    missing = sorted(EXPECTED_PLUGINS - set(plugins))
    if code == 0 and missing:
        code, note = 1, f"plugins not found: {missing} (olmx's entry points)"
    if code == 0:  # the concurrent runs would wait on one another's tokenization (a file lock)
        tok_code, _, tok_note = run_one(
            [ctx.py, "-c", TOKENIZE], logs / "tokens.log", ctx.env(), ctx.cwd, box - (time.time() - start)
        )
        info["stdlib_tokens"] = (
            "cached" if tok_code == 0 else f"not prebuilt: {tok_note or first_error(tail(logs / 'tokens.log', 4000))}"
        )
    output = listing
    ctx.report.result({**step_record("olmx", code, round(time.time() - start, 1), box, note, output), **info})


def step_environment(ctx: Ctx) -> None:
    """The probe in a process of its own (torch is not imported here)."""
    box = ctx.begin("environment")
    if box is None:
        return
    log = ctx.scratch / "logs" / "environment.log"
    args = [ctx.py, str(Path(__file__).resolve()), "--probe-env", "--scratch", str(ctx.scratch)]
    code, seconds, note = run_one(args, log, ctx.env(), ctx.cwd, box)
    text = tail(log, 200000)
    found = [line[len("SMOKE_ENV ") :] for line in text.splitlines() if line.startswith("SMOKE_ENV ")]
    record = step_record("environment", code if found or code else 1, seconds, box, note, text)
    if found:
        env = json.loads(found[-1])
        broken = {k: v for k, v in env.get("import_errors", {}).items() if k in REQUIRED_IMPORTS}
        if broken:
            name, error = next(iter(broken.items()))
            ctx.unusable = f"`import {name}` fails (the environment step says why)"
            note = f"`import {name}` fails on this interpreter with the install: {error}"
            record = step_record("environment", 1, seconds, box, note, text)
        record.update(env)
        if env.get("capability"):
            ctx.cc = tuple(env["capability"])  # type: ignore[assignment]
        if env.get("gpu"):
            ctx.gpu_name = env["gpu"]
    ctx.report.result(record)


def olmx_args(ctx: Ctx, run_dir: Path, overrides: list[str]) -> list[str]:
    """``olmx train`` (or, planning only, its ``--dry-run`` for ``ctx.gpu_name``)."""
    args = [ctx.py, "-m", "olmx", "train", *COMMON, *overrides, f"trainer.run_dir={run_dir}"]
    if ctx.mode == "plan":
        args = [a for a in args if a != "infra.nproc_per_node=1"]
        args += ["infra=slurm", "infra.gpus_per_node=1", f"infra.gpu_name={ctx.gpu_name}", "--dry-run"]
    return args


def run_record(
    ctx: Ctx, name: str, proc: Proc, code: int, note: str | None, box: float, run_dir: Path
) -> dict[str, Any]:
    """A run's line: its outcome and (where it trained) its figures; the run directory goes."""
    output = proc.output(3000)
    if code and run_dir.joinpath("logs", "node0.log").exists():
        output += "\n----- node0.log -----\n" + tail(run_dir / "logs" / "node0.log", 3000)
    record = step_record(name, code, round(time.time() - proc.start, 1), box, note, output)
    if ctx.mode == "plan":
        record.update(plan_rows(proc.output(200000)))
    else:
        try:
            record.update(read_olmx_run(run_dir, proc.start))
        except Exception as exc:  # noqa: BLE001 - the outcome stands without the figures
            record["read_error"] = f"{type(exc).__name__}: {exc}"
        shutil.rmtree(run_dir, ignore_errors=True)
    return record


def plan_rows(text: str) -> dict[str, str]:
    """The estimates of a printed plan (``olmx train --dry-run``): peak memory, step time."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2 and cells[0] in ("estimated peak", "step time", "tokens/s"):
            out["plan_" + cells[0].replace(" ", "_").replace("/", "_per_")] = cells[1]
    return out


def step_30m(ctx: Ctx) -> None:
    """Every path of the 30M model at once, each line the moment its run ends."""
    runs: dict[str, tuple[Proc, Path]] = {}
    size = SMALL["gpu" if ctx.mode == "plan" else ctx.mode]
    cc = ctx.cc
    if ctx.mode == "plan":
        from olmx.launch.devices import gpu_compute_capability

        cc = gpu_compute_capability(ctx.gpu_name)
    todo: list[tuple[str, list[str]]] = []
    for v in VARIANTS:
        name = f"30m {v.name}"
        if ctx.mode == "rehearse" and isinstance(v.cpu, str):
            ctx.report.skip(name, v.cpu)
        elif ctx.mode != "rehearse" and cc is not None and cc < v.min_cc:
            ctx.report.skip(name, f"needs compute capability {v.min_cc[0]}.{v.min_cc[1]}")
        else:
            extra = list(v.cpu) if ctx.mode == "rehearse" and isinstance(v.cpu, tuple) else []
            todo.append((name, [*size, *v.overrides, *extra]))
    if not todo:
        return
    box = ctx.box("30m")
    if box is None:
        for name, _ in todo:
            ctx.report.skip(name, f"out of budget: {max(0, ctx.left()):.0f} s left")
        return
    ctx.report.begin("30m (" + ", ".join(n[4:] for n, _ in todo) + ")", box)
    env = ctx.env()
    if ctx.gpu:  # graph breaks and recompiles in the node logs; the cores shared by the compilations
        threads = str(max(1, (os.cpu_count() or 1) // len(todo)))
        env = ctx.env(TORCH_LOGS="graph_breaks,recompiles", TORCHINDUCTOR_COMPILE_THREADS=threads)
    for name, overrides in todo:
        slug = re.sub(r"[^a-z0-9]+", "_", name)
        run_dir = ctx.scratch / "runs" / slug
        shutil.rmtree(run_dir, ignore_errors=True)
        runs[name] = (
            Proc(olmx_args(ctx, run_dir, overrides), ctx.scratch / "logs" / f"{slug}.log", env, ctx.cwd),
            run_dir,
        )

    def done(name: str, proc: Proc, code: int, note: str | None) -> None:
        record = run_record(ctx, name, proc, code, note, box, runs[name][1])
        if ctx.mode == "rehearse" and any("emulate=true" in o for o in dict(todo)[name]):
            record["note"] = (record.get("note", "") + " (torchao emulation on CPU)").strip()
        ctx.report.result(record)

    wait_all({n: p for n, (p, _) in runs.items()}, time.time() + box, done)


class GpuSampler:
    """``nvidia-smi`` twice a second, from a thread, while a step runs: the most memory used (the
    allocator's reserve plus the CUDA context) and the mean utilisation of the busy samples.
    Nothing where there is no ``nvidia-smi``."""

    QUERY = ["--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]

    def __init__(self, enabled: bool, interval: float = 0.5) -> None:
        self.used: list[int] = []
        self.util: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval = interval
        if enabled and shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                smi = subprocess.run(["nvidia-smi", *self.QUERY], capture_output=True, text=True, timeout=10)
                parts = [p.strip() for p in smi.stdout.splitlines()[0].split(",")] if smi.stdout.strip() else []
                if len(parts) == 2 and all(p.isdigit() for p in parts):
                    self.used.append(int(parts[0]))
                    self.util.append(int(parts[1]))
            except (OSError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        """End the sampling; its figures."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if not self.used:
            return {}
        busy = [u for u in self.util if u > 0]
        return {
            "gpu_mem_used_max_mib": max(self.used),
            "gpu_util_mean": round(sum(busy) / len(busy), 1) if busy else 0.0,
            "gpu_samples": len(self.used),
        }


def step_1b(ctx: Ctx) -> dict[str, Any]:
    """The 1B run (its stand-in in rehearsal): speed, memory and its one checkpoint save."""
    box = ctx.begin("1b")
    if box is None:
        return {}
    run_dir = ctx.scratch / "runs" / "1b"
    shutil.rmtree(run_dir, ignore_errors=True)
    size = BIG["gpu" if ctx.mode == "plan" else ctx.mode]
    env = ctx.env(TORCH_LOGS="graph_breaks,recompiles") if ctx.gpu else ctx.env()
    sampler = GpuSampler(ctx.gpu)
    proc = Proc(olmx_args(ctx, run_dir, size), ctx.scratch / "logs" / "1b.log", env, ctx.cwd)
    out: list[dict[str, Any]] = []
    wait_all(
        {"1b": proc}, time.time() + box, lambda *a: out.append(run_record(ctx, "1b", a[1], a[2], a[3], box, run_dir))
    )
    record = {**out[0], **sampler.stop()}
    ctx.report.result(record)
    return record


def read_timing(timing: Path, tokens_per_step: int, big: dict[str, Any]) -> dict[str, Any]:
    """The figures of ``handwritten_train.py``'s ``timing.jsonl``, and the ratio to the 1B run's."""
    recs = [r for r in jsonl(timing) if r.get("loss") is not None]
    if not recs:
        return {}
    for r in recs:
        r["tokens"] = r["step"] * tokens_per_step
    win = window_rate(recs, tokens_per_step, max(2, recs[-1]["step"] // 4))
    out: dict[str, Any] = {
        "steps": recs[-1]["step"],
        "first_loss": round(recs[0]["loss"], 4),
        "last_loss": round(recs[-1]["loss"], 4),
        "tokens_per_s": win.get("tokens_per_s"),
        "window": win.get("window"),
    }
    if big.get("tokens_per_s") and win.get("tokens_per_s"):
        out["ratio"] = round(big["tokens_per_s"] / win["tokens_per_s"], 4)
        if big.get("mfu"):
            out["mfu"] = round(big["mfu"] / out["ratio"], 4)
    return out


def step_olmo_core(ctx: Ctx, big: dict[str, Any]) -> None:
    """OLMo-core alone on the 1B run's model and batch, stopped after its last step."""
    if ctx.mode == "plan":
        ctx.report.skip("1b olmo-core", "runs only on a GPU (or in rehearsal)")
        return
    box = ctx.begin("1b olmo-core")
    if box is None:
        return
    run_dir = ctx.scratch / "runs" / "1b_olmo_core"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = OLMO_CORE[ctx.mode]
    steps = int(args[args.index("--steps") + 1])
    seq, seqs = int(args[args.index("--seq-len") + 1]), int(args[args.index("--global-seqs") + 1])
    torchrun = [ctx.py, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1", "--standalone"]
    script = str(REPO / "benchmarks" / "handwritten_train.py")
    timing = run_dir / "timing.jsonl"
    env = ctx.env(TORCH_LOGS="graph_breaks,recompiles") if ctx.gpu else ctx.env()
    sampler = GpuSampler(ctx.gpu)
    proc = Proc(
        [*torchrun, "--max-restarts=0", script, "--run-dir", str(run_dir), *args],
        ctx.scratch / "logs" / "1b_olmo_core.log",
        env,
        ctx.cwd,
    )

    def finished(_name: str) -> bool:
        recs = jsonl(timing)
        return bool(recs) and recs[-1].get("step", 0) >= steps

    out: list[tuple[int, str | None]] = []
    wait_all({"x": proc}, time.time() + box, lambda _n, _p, code, note: out.append((code, note)), finished)
    code, note = out[0]
    output = proc.output(3000)
    record = step_record("1b olmo-core", code, round(time.time() - proc.start, 1), box, note, output)
    record.update(sampler.stop())
    if ctx.gpu:
        record.update(compile_counts(tail(proc.log, 2_000_000)))
    try:
        record.update(read_timing(timing, seq * seqs, big))
    except Exception as exc:  # noqa: BLE001 - the outcome stands without the figures
        record["read_error"] = f"{type(exc).__name__}: {exc}"
    if ctx.mode == "rehearse":
        record["note"] = (
            record.get("note", "") + " (rehearsal: OLMo-core's tiny DDP run, not the 1b stand-in)"
        ).strip()
    shutil.rmtree(run_dir, ignore_errors=True)
    ctx.report.result(record)


# --------------------------------------------------------------------------- main


def plan_of(mode: str) -> list[str]:
    """The names of the steps the sequence will report, in order."""
    steps = [] if mode == "plan" else ["install", "olmx", "environment"]
    steps += [f"30m {v.name}" for v in VARIANTS] + ["1b", "1b olmo-core"]
    return steps


def guarded(ctx: Ctx, names: list[str], step: Callable[..., Any], *args: Any) -> Any:
    """Run a step; an error of this script's own (a figure it did not expect) ends that step
    only: its processes are killed and its steps not yet reported fail with the traceback."""
    try:
        return step(ctx, *args)
    except Exception as exc:  # noqa: BLE001 - any error of this script; Cut (SIGTERM) goes on up
        if isinstance(exc, Cut):
            raise
        for proc in list(ACTIVE):
            proc.kill(quick=True)
        trace = traceback.format_exc()
        for name in names:
            if name not in ctx.report.reported:
                note = f"smoke.py error: {type(exc).__name__}: {exc}"
                ctx.report.result({"step": name, "status": "fail", "note": note, "failure_output": trace})
        return None


def clear_scratch(scratch: Path) -> None:
    """An empty scratch folder: a previous one is renamed aside and removed by a background
    ``rm`` (thousands of installed files take seconds of the budget to delete)."""
    if scratch.exists():
        aside = scratch.with_name(f"{scratch.name}.old-{os.getpid()}")
        scratch.rename(aside)
        subprocess.Popen(["rm", "-rf", str(aside)], start_new_session=True, stdin=subprocess.DEVNULL)
    scratch.mkdir(parents=True, exist_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "gpu" / "out")
    parser.add_argument("--rehearse", action="store_true", help="the same sequence on a CPU, tiny sizes")
    parser.add_argument("--plan-only", action="store_true", help="plan every run (--dry-run); needs no GPU")
    parser.add_argument("--gpu-name", default="NVIDIA H200", help="the GPU --plan-only plans for")
    parser.add_argument("--deadline", type=float, default=None, help="epoch second by which all must be done")
    parser.add_argument("--budget", type=float, default=None, help="seconds from now (without --deadline)")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="the wheels of benchmarks/gpu/wheels.sh")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/olmx-smoke"), help="install, runs and logs")
    parser.add_argument("--probe-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_env:
        print("SMOKE_ENV " + json.dumps(probe_environment(args.scratch), default=str), flush=True)
        return 0
    mode = "plan" if args.plan_only else "rehearse" if args.rehearse else "gpu"
    started = time.time()
    if mode == "gpu":
        check = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
        if subprocess.run([sys.executable, "-c", check], capture_output=True, timeout=300, check=False).returncode:
            print(
                f"smoke.py: no CUDA GPU visible to {sys.executable} (torch.cuda.is_available() is false): nothing "
                "to measure; --rehearse runs the sequence on this CPU, --plan-only plans it",
                file=sys.stderr,
            )
            return 3
    deadline = args.deadline or started + (args.budget or BUDGET[mode])
    if args.deadline and args.deadline - started < 30:
        print(f"smoke.py: only {args.deadline - started:.0f} s left of the budget", file=sys.stderr)
    clear_scratch(args.scratch)
    report = Report(args.out.absolute(), mode, started, deadline)
    ctx = Ctx(
        mode=mode,
        py=sys.executable,
        out=args.out.absolute(),
        scratch=args.scratch.absolute(),
        wheels=args.wheels.absolute(),
        gpu_name=args.gpu_name,
        report=report,
        deadline=deadline,
    )
    report.plan(plan_of(mode), python=sys.executable, scratch=str(ctx.scratch))

    def on_term(signum: int, _frame: Any) -> None:
        raise Cut(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    paths = [f"30m {v.name}" for v in VARIANTS]
    try:
        if mode != "plan":
            guarded(ctx, ["install"], step_install)
            if ctx.site is not None:
                sys.path.insert(0, str(ctx.site))  # olmx's peak table, for MFU
            guarded(ctx, ["olmx"], step_olmx)
            guarded(ctx, ["environment"], step_environment)
        if ctx.unusable:
            for name in [*paths, "1b", "1b olmo-core"]:
                report.skip(name, f"not run: {ctx.unusable}")
        else:
            guarded(ctx, paths, step_30m)
            big = guarded(ctx, ["1b"], step_1b) or {}
            guarded(ctx, ["1b olmo-core"], step_olmo_core, big)
    except (Cut, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the reporting
        for proc in list(ACTIVE):
            proc.kill(quick=True)
        why = f"cut at {time.time() - started:.0f} s by {exc or type(exc).__name__} (the outer time limit)"
        for name in report.planned:
            if name not in report.reported:
                report.result({"step": name, "status": "cut", "note": why})
        return 124
    finally:
        for proc in list(ACTIVE):
            proc.kill()
    report.summary()
    print((args.out / "summary.md").read_text())
    failed = [r["step"] for r in report.records if r["status"] in ("fail", "timeout")]
    if failed:
        print(
            f"smoke.py: failed or timed out: {', '.join(failed)} (tails in {args.out / 'failures.txt'})",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
