"""``olmx report RUN_DIR [--compare RUN_DIR...]``: a run's summary table and its plots.

Everything comes from the files the run left (no torch, works on a finished, stopped or
crashed run): ``plan.yaml`` (config, world, batch), ``metrics.jsonl`` (per step),
``summary.json`` (per process, written when training ends) and ``events.jsonl`` (starts,
restarts and their causes, stops, non-finite steps, checkpoints found corrupt). Only the part
of the history after the last ``trainer.resume=false`` start is reported.

Written to ``RUN_DIR/report/`` (a comparison to ``RUN_DIR/report/compare/``, or to ``--out
DIR``, so the run's own report stays): ``loss.png``, ``lr.png``, ``throughput.png``, ``memory.png``
(steps on the x axis; dotted lines where the run resumed, red dashes at non-finite steps, a red
cross where a failed run ended) and
``summary.txt``. The loss plot draws the held-out loss (``eval/loss``, dashed, with markers)
beside the training loss. A run with ``eval.downstream`` adds ``downstream.png``: every
accuracy-type metric of its tasks (OLMo-core's ``eval/downstream/<task> (... accuracy)``) by step,
and the summary's last values. With ``--compare`` every plot overlays the other runs and the table
has one column per run.

Metric names are the run's vocabulary (:mod:`olmx.metrics`, the names every tracker records too).
The peak memory row says what was measured: CUDA's allocator peak, or on CPU the process's
resident set, given also above the process's start (torch and OLMo-core, ~0.5 GiB, recorded
before the model was built), and its ratio to the plan's estimate of live tensors
(:data:`olmx.plan.memory.MEASURED_AS`; on CPU the heap keeps freed blocks, up to 2x).

MFU is the measured model FLOP/s per device (OLMo-core's ``throughput/device/flopsPS``, from
its FLOPs-per-token count) over the device's dense BF16 peak (:data:`olmx.launch.devices.PEAK_FLOPS`); it is
shown only for a known GPU and BF16-class precision (bf16, mxfp8), as OLMo-core does.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmx import metrics as names
from olmx.errors import ConfigError
from olmx.events import read_events
from olmx.goodput import account, bar, straggler
from olmx.rundir import RunDir

REPORT_DIR = "report"
PLOTS = ("loss", "lr", "throughput", "memory")
#: The plot of the downstream tasks' accuracies, written when a run has any.
DOWNSTREAM_PLOT = "downstream"


def downstream_accuracies(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Each accuracy-type downstream metric of a run (OLMo-core's first version of each: the
    ``v2`` twins are left out), named ``<task> (<metric>)``, with its (step, value) points."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for key, value in r.items():
            if key.startswith(names.DOWNSTREAM_PREFIX) and "accuracy" in key and not key.endswith(" v2)"):
                out.setdefault(key.removeprefix(names.DOWNSTREAM_PREFIX), []).append((r["step"], value))
    return out


@dataclass
class RunData:
    """What a run directory holds, read once."""

    path: Path
    plan: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any] | None
    events: list[dict[str, Any]]
    label: str = ""
    rows: dict[str, str] = field(default_factory=dict)


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (ConfigError if it is not one)."""
    from olmx.plan import Plan

    path = Path(run_dir).expanduser()
    rd = RunDir(path)
    plan_path = rd.plan
    if not plan_path.is_file():
        raise ConfigError("RUN_DIR", f"'{path}' is not an olmx run directory (it has no plan.yaml)")
    plan = Plan.load(plan_path).to_dict()  # the one guarded reader: a cut or hand-broken file is one line
    records = []
    metrics = rd.metrics
    if metrics.exists():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    summary = None
    if rd.summary.is_file():
        try:
            summary = json.loads(rd.summary.read_text())
        except ValueError:
            summary = None
    events = read_events(path)
    fresh = [i for i, e in enumerate(events) if e["event"] == "fresh"]
    if fresh:
        events = events[fresh[-1] + 1 :]
    return RunData(path=path, plan=plan, records=records, summary=summary, events=events, label=path.name)


def config_digest(plan: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of the resolved config (canonical JSON)."""
    return hashlib.sha256(json.dumps(plan["config"], sort_keys=True, default=str).encode()).hexdigest()[:12]


def peak_flops(device_name: str, compute_dtype: str) -> float | None:
    """Dense 16-bit peak FLOP/s of one device for a run computing in ``compute_dtype`` (the
    plan's ``dtypes.param``; None for float32 or where unknown), from
    :data:`olmx.launch.devices.PEAK_FLOPS`."""
    from olmx.hardware import peak_flops as device_peak

    return None if compute_dtype == "float32" else device_peak(device_name, "bfloat16")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _launches(run: RunData) -> list[dict[str, Any]]:
    """The run's history by launch, in order: its starts (one per torchrun attempt), the rank
    failures the launcher recorded for each attempt (written when the launch ended), its end."""
    launches: dict[Any, dict[str, Any]] = {}
    for e in run.events:
        launch = launches.setdefault(e.get("launch"), {"starts": [], "failures": {}, "end": None})
        if e["event"] == "start":
            launch["starts"].append(e)
            launch["end"] = None  # a later attempt: only its own end counts
        elif e["event"] in ("end", "hang"):
            launch["end"] = e
        elif e["event"] == "rank_failed":
            launch["failures"][e.get("attempt", 0)] = e
    return [launch for launch in launches.values() if launch["starts"] or launch["failures"]]


def _ending(launch: dict[str, Any]) -> tuple[str, str]:
    """(state, detail) of how one launch ended."""
    end, last = launch["end"], len(launch["starts"]) - 1
    if end is not None and end["event"] == "hang":
        return "hung", f"at step {end.get('step')}: {end.get('summary')}"
    if end is not None:
        reason, step = end.get("reason"), end.get("step")
        if reason == "max_steps":
            return "finished", ""
        if reason == "stop_at_step":
            return "paused", f"trainer.stop_at_step={step}"
        if reason == "nonfinite":
            return "stopped", f"non-finite loss at step {step}"
        return "stopped", f"{reason} at step {step}, checkpoint saved"
    failure = launch["failures"].get(last) or launch["failures"].get(max(launch["failures"], default=None))
    if failure is not None:
        return "failed", _failure(failure)
    return "running or died", ""


def _status(run: RunData) -> str:
    """How the run stands: finished, stopped (why), or failed (which rank, why)."""
    launches = _launches(run)
    if not launches:
        return "no record yet"
    state, detail = _ending(launches[-1])
    return f"{state}{f' ({detail})' if detail else ''}"


def _failure(e: dict[str, Any]) -> str:
    return f"node {e.get('node_rank', 0)} local rank {e.get('local_rank')}: {e.get('cause')}"


def _restarts(run: RunData) -> list[str]:
    """Every start after the run's first one, with its cause: a rank failure (torchrun restart)
    or how the previous launch ended (relaunch)."""
    out, previous = [], None
    for launch in _launches(run):
        for start in launch["starts"]:
            attempt = start.get("attempt", 0)
            frm = start.get("resumed_from") or 0
            if attempt > 0:
                failure = launch["failures"].get(attempt - 1)
                out.append(
                    f"torchrun restart from step {frm} after "
                    f"{_failure(failure) if failure else 'a failure torchrun did not report'}"
                )
            elif previous is not None:
                state, detail = _ending(previous)
                out.append(
                    f"relaunch from step {frm} after the previous launch {state}{f' ({detail})' if detail else ''}"
                )
        previous = launch
    return out


def summarize(run: RunData) -> dict[str, str]:
    """The rows of the summary table for one run."""
    plan, records = run.plan, run.records
    cfg, world, batch = plan["config"], plan["world"], plan["batch"]
    model, t = cfg["model"], cfg["trainer"]
    tokens_per_step = batch["global_seqs"] * batch["seq_len"]
    losses = [(r["step"], r[names.LOSS]) for r in records if r.get(names.LOSS) is not None]
    held = [(r["step"], r[names.EVAL_LOSS]) for r in records if r.get(names.EVAL_LOSS) is not None]
    last_step = records[-1]["step"] if records else 0
    precision = (cfg.get("precision") or {}).get("name", "?")
    parallel = ",".join(cfg.get("parallel", {}) or []) or "none"
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731

    procs = sorted((run.summary or {}).get("processes", []), key=lambda p: p["rank"])
    if procs and all(p.get("tokens_per_s") for p in procs):
        tps = ", ".join(fmt(p["tokens_per_s"], ",.0f") for p in procs)
    else:
        tps = fmt(_median([r.get(names.TOKENS_PER_S_PER_PROCESS) for r in records]), ",.0f")
    flops = _median([r.get(names.FLOPS_PER_S) for r in records])
    peak = peak_flops(world.get("device_name", ""), (plan.get("dtypes") or {}).get("param", "float32"))
    mfu = (
        f"{100 * flops / peak:.3g}%"
        if flops and peak
        else f"- (peak of '{world.get('device_name')}' with {precision} unknown)"
    )
    memory = _memory(plan, procs, records)
    nonfinite = [e["step"] for e in run.events if e["event"] == "nonfinite"]
    problems = [
        f"step {e.get('step')} corrupt ({e.get('problem')})" for e in run.events if e["event"] == "checkpoint_corrupt"
    ]
    problems += [f"{Path(e['path']).name} partial, removed" for e in run.events if e["event"] == "checkpoint_partial"]
    restarts = _restarts(run)
    best = min(losses, key=lambda sl: sl[1]) if losses else (0, float("nan"))
    downstream = downstream_accuracies(records)
    return {
        "status": _status(run),
        "config digest": f"{config_digest(plan)}  (d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{plan['params']['total']:,} params, seq {batch['seq_len']}, lr {t['lr']}, "
        f"{precision}, parallel {parallel})",
        "world": f"{world['nnodes']} x {world['nproc_per_node']} {world.get('device_name', '')}",
        "steps": f"{last_step} / {t['max_steps']}",
        "tokens": f"{last_step * tokens_per_step:,}",
        "loss first / last / best": (
            f"{fmt(losses[0][1], '.4f')} / {fmt(losses[-1][1], '.4f')} / {best[1]:.4f} (step {best[0]})"
        )
        if losses
        else "-",
        "held-out loss first / last / best": (
            f"{held[0][1]:.4f} / {held[-1][1]:.4f} / {min(v for _, v in held):.4f} "
            f"(steps {held[0][0]}, {held[-1][0]}; perplexity last {math.exp(held[-1][1]):.2f})"
        )
        if held
        else "- (no evaluation: eval.interval)",
        "downstream (last)": ", ".join(f"{k} {v[-1][1]:.4f} (step {v[-1][0]})" for k, v in downstream.items())
        or "- (no eval.downstream)",
        "tokens/s per device": tps,
        "MFU": mfu,
        "peak memory (MiB)": memory,
        "restarts": f"{len(restarts)}" + "".join(f"\n- {r}" for r in restarts),
        "non-finite steps": f"{len(nonfinite)}"
        + (
            f" (steps {', '.join(map(str, nonfinite))}, on_nonfinite={t.get('on_nonfinite', 'stop')})"
            if nonfinite
            else ""
        ),
        "checkpoint problems": "; ".join(problems) or "none",
        "stragglers": straggler(records) or "none",
        "goodput": bar(found)
        if (found := account(run.path))
        else "- (no clock ledger: a run from before olmx kept one)",
    }


def _memory(plan: dict[str, Any], procs: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The peak memory row: what was measured (the allocator's peak on CUDA, the process's RSS
    on CPU, whose start, torch and OLMo-core, is subtracted there) per process, and its ratio to
    the plan's estimate of live tensors (:data:`olmx.plan.memory.MEASURED_AS`)."""
    from olmx.plan.memory import peak_of

    cuda = plan["world"].get("device") == "cuda"
    found = [p.get(names.PEAK_MEMORY) for p in procs]
    if not procs:  # no summary.json (a crash): the largest any step recorded
        found = [max((r[names.PEAK_MEMORY] for r in records if r.get(names.PEAK_MEMORY) is not None), default=None)]
    peaks: list[float] = [p for p in found if p is not None]
    if not peaks or len(peaks) < len(found):
        return "-"
    text = f"{'allocator peak' if cuda else 'process RSS'} {', '.join(f'{p:,.0f}' for p in peaks)}"
    compared = peaks
    bases: list[float] = [p["base_rss_mib"] for p in procs if p.get("base_rss_mib") is not None]
    if not cuda and procs and len(bases) == len(procs):
        compared = [p - b for p, b in zip(peaks, bases, strict=True)]
        text += f"; above the start (torch, OLMo-core: {', '.join(f'{b:,.0f}' for b in bases)}) "
        text += ", ".join(f"{c:,.0f}" for c in compared)
    elif not cuda:
        compared = []  # an older run: no start recorded, nothing like the estimate to compare
    estimate = peak_of((plan.get("sections") or {}).get("memory", []))
    if estimate:
        mib = estimate / 2**20
        text += f"; plan's estimate {mib:,.0f} of live tensors"
        if compared:
            text += f", {'measured' if cuda else 'above the start'} / estimate {max(compared) / mib:.2f}"
    return text


def _resume_steps(run: RunData) -> list[int]:
    return [e["resumed_from"] for e in run.events if e["event"] == "start" and e.get("resumed_from")]


def plot(runs: list[RunData], out_dir: Path) -> list[Path]:
    """Write the four PNG plots (every run overlaid) into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {
        "loss": ("loss", lambda r: r.get(names.LOSS)),
        "lr": ("learning rate", lambda r: r.get(names.LR)),
        "throughput": ("tokens/s per device", lambda r: r.get(names.TOKENS_PER_S_PER_PROCESS)),
        "memory": ("peak memory per process (MiB)", lambda r: r.get(names.PEAK_MEMORY)),
    }
    paths = []
    for name in PLOTS:
        ylabel, get = series[name]
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for i, run in enumerate(runs):
            points = [(r["step"], get(r)) for r in run.records if get(r) is not None]
            held = [(r["step"], r[names.EVAL_LOSS]) for r in run.records if r.get(names.EVAL_LOSS) is not None]
            held = held if name == "loss" else []
            color = f"C{i}"
            if points:
                xs, ys = zip(*points, strict=True)
                label = f"{run.label} training" if held else run.label
                ax.plot(xs, ys, color=color, label=label, marker="." if len(points) < 60 else None)
                if _status(run).startswith("failed"):  # where it died
                    ax.plot(xs[-1], ys[-1], "x", color="red", markersize=12, markeredgewidth=2)
            if held:  # the held-out loss beside the training loss, dashed
                xs, ys = zip(*held, strict=True)
                ax.plot(xs, ys, color=color, linestyle="--", marker="o", label=f"{run.label} held-out (eval/loss)")
            for step in _resume_steps(run):
                ax.axvline(step, color=color, linestyle=":", alpha=0.7)
            for step in (e["step"] for e in run.events if e["event"] == "nonfinite"):
                ax.axvline(step, color="red", linestyle="--", alpha=0.6)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} ({', '.join(r.label for r in runs)})")
        ax.grid(alpha=0.3)
        if len(runs) > 1 or any(str(line.get_label()).endswith("(eval/loss)") for line in ax.get_lines()):
            ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    if any(downstream_accuracies(run.records) for run in runs):
        paths.append(_plot_downstream(plt, runs, out_dir))
    return paths


def _plot_downstream(plt: Any, runs: list[RunData], out_dir: Path) -> Path:
    """``downstream.png``: :func:`downstream_accuracies` of every run, one line per metric."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for i, run in enumerate(runs):
        for j, (metric, points) in enumerate(downstream_accuracies(run.records).items()):
            xs, ys = zip(*points, strict=True)
            style = ("-", "--", ":", "-.")[i % 4]
            ax.plot(xs, ys, color=f"C{j}", linestyle=style, marker="o", label=f"{run.label} {metric}")
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.set_title(f"downstream tasks ({', '.join(r.label for r in runs)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / f"{DOWNSTREAM_PLOT}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


#: Where ``--compare`` writes, inside the first run's ``report/`` (its own report stays).
COMPARE_DIR = "compare"
_REPORT_FILES = {f"{n}.png" for n in (*PLOTS, DOWNSTREAM_PLOT)} | {"summary.txt"}


def report_dir(run_dir: str | Path, *, compare: bool = False, out_dir: str | Path | None = None) -> Path:
    """Where a report goes: ``out_dir`` if given; else ``RUN_DIR/report/`` for the run alone and
    ``RUN_DIR/report/compare/`` for a comparison (so that the run's own report is kept). An
    ``out_dir`` that holds files other than a report's is refused (``--out``): olmx overwrites
    only what it wrote."""
    if out_dir is None:
        base = Path(run_dir) / REPORT_DIR
        return base / COMPARE_DIR if compare else base
    path = Path(out_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError("--out", f"'{path}' exists and is not a folder")
    others = sorted(p.name for p in path.iterdir() if p.name not in _REPORT_FILES) if path.is_dir() else []
    if others:
        raise ConfigError(
            "--out", f"'{path}' holds files that are not an olmx report ({', '.join(others[:5])}); name a new folder"
        )
    return path


def write_report(
    run_dir: str | Path,
    *,
    compare: list[str | Path] | None = None,
    console: Any = None,
    out_dir: str | Path | None = None,
) -> Path:
    """Print the summary table and write the plots and ``summary.txt`` of ``run_dir``,
    overlaying the runs in ``compare``, into :func:`report_dir` (``RUN_DIR/report/``, or
    ``RUN_DIR/report/compare/`` for a comparison, or ``out_dir``); returns that folder."""
    from rich.table import Table

    from olmx.console import make_console

    runs = [load_run(run_dir)] + [load_run(p) for p in compare or []]
    if len({r.label for r in runs}) < len(runs):
        for r in runs:
            r.label = str(r.path)
    for r in runs:
        r.rows = summarize(r)
    out_dir = report_dir(runs[0].path, compare=len(runs) > 1, out_dir=out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(runs, out_dir)

    # the title is a line of its own: a table's title wraps at the table's width (a long path)
    title = f"olmx report: {runs[0].path}"
    table = Table(show_header=len(runs) > 1)
    table.add_column("", style="bold")
    for r in runs:
        table.add_column(r.label)
    for key in runs[0].rows:
        table.add_row(key, *(r.rows[key] for r in runs))
    text = make_console(record=True, file=io.StringIO())  # a file: nothing wrapped or cut
    text.print(title, markup=False)
    text.print(table)
    (out_dir / "summary.txt").write_text(text.export_text())
    console = console or make_console()
    console.print(title, style="bold", markup=False)
    console.print(table)
    console.print(f"plots: {', '.join(str(p) for p in plots)}", markup=False)
    return out_dir
