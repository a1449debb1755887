"""RunConfig -> Plan: every check, no torch.

All cross-plugin validation happens here, before anything is launched or written, and
raises :class:`ConfigError` naming the field and the numbers.
"""

from __future__ import annotations

import glob
import os
import re
import sysconfig
from datetime import datetime
from pathlib import Path
from typing import Any

from olmx import __version__
from olmx.config.schema import ModelConfig, RunConfig
from olmx.errors import ConfigError
from olmx.plan import BatchPlan, ParamCounts, Plan
from olmx.api import Contribution, World
from olmx.registry import Registry

BLOCKS = ("default", "reordered_norm")
ATTN_BACKENDS = ("auto", "torch", "flash_2", "flash_3", "te")
SCHEDULES = ("cosine", "linear", "constant")
DATA_SOURCES = ("stdlib", "text", "numpy")
#: ``trainer.activation_checkpointing``: OLMo-core's ``full`` (every block) and olmx's
#: ``long_context`` (olmx.worker.train.LONG_CONTEXT_AC_MODULES). OLMo-core's ``selected_ops``
#: is not offered: with torch 2.13 its recompute fails in RoPE ("aten.alias.default invocation
#: index 4 encountered during backward but not found in storage", benchmarks/results/ulysses.md).
AC_MODES = ("full", "long_context")
#: Sub-directory of the run directory that holds OLMo-core checkpoints (``stepN/``).
CHECKPOINTS = "checkpoints"


def padded_vocab(vocab_size: int, multiple: int = 128) -> int:
    """Vocabulary rounded up as OLMo-core's ``TokenizerConfig.padded_vocab_size`` does."""
    return -(-vocab_size // multiple) * multiple


def count_params(model: ModelConfig, vocab: int) -> ParamCounts:
    """Parameters of the OLMo-core llama-like transformer ``model`` builds (tested against
    OLMo-core's own count for every preset)."""
    d, h = model.d_model, model.n_heads
    kv = model.n_kv_heads or h
    head_dim = d // h
    attn = d * h * head_dim + 2 * d * kv * head_dim + h * head_dim * d
    if model.qk_norm:
        attn += h * head_dim + kv * head_dim
    block = attn + 3 * d * model.hidden_size + 2 * d
    embedding = vocab * d
    total = embedding + model.n_layers * block + d + d * vocab
    return ParamCounts(total=total, embedding=embedding, active=total)


def latest_checkpoint(run_dir: str | Path) -> int | None:
    """Step of the newest complete checkpoint in ``run_dir`` (None if there is none)."""
    root = Path(run_dir) / CHECKPOINTS
    steps = []
    for p in root.glob("step*"):
        m = re.fullmatch(r"step(\d+)", p.name)
        if m and (p / ".metadata.json").is_file():
            steps.append(int(m.group(1)))
    return max(steps) if steps else None


def resolve(run: RunConfig, reg: Registry, *, now: datetime | None = None) -> Plan:
    """Check the run and compute its plan."""
    infra = reg.get("infra", run.infra_name)
    world: World = infra.world(run.infra[run.infra_name])
    if world.size < 1:
        raise ConfigError("infra", f"the run needs at least one process, got {world.nnodes} x {world.nproc_per_node}")
    _check_model(run.model)
    data_here = getattr(infra, "data_on_this_machine", None)
    _check_data(run, files_here=data_here is None or data_here(run.infra[run.infra_name]))
    _check_trainer(run)

    sections: dict[str, list[tuple[str, str]]] = {}
    contributions: dict[str, Contribution] = {}
    for kind, group in (("layer", "layers"), ("parallel", "parallel"), ("precision", "precision")):
        for name, cfg in getattr(run, group).items():
            c = reg.get(kind, name).resolve(cfg, run, world)
            contributions[f"{group}.{name}"] = c
            sections[f"{group}.{name}"] = c.rows

    dp = [k for k, c in contributions.items() if c.data_parallel]
    if len(dp) > 1:
        raise ConfigError("parallel", f"choose one data-parallel strategy, got {', '.join(k.split('.')[1] for k in dp)}")
    if world.size > 1 and not dp:
        raise ConfigError(
            "parallel", f"{world.size} processes need a data-parallel strategy to keep replicas in sync "
            f"(without one OLMo-core trains diverging copies); add one of: "
            f"{', '.join(n for n in reg.names('parallel') if n in ('ddp', 'fsdp', 'hsdp')) or 'ddp'} "
            f"(e.g. parallel=[ddp]) or run one process (infra.nproc_per_node=1)")

    # Non-data-parallel degrees (context parallel, ...) multiply into the world; the
    # data-parallel strategy lays out whatever ranks remain.
    other: dict[str, int] = {}
    for c in contributions.values():
        if c.data_parallel:
            continue
        for dim, size in c.mesh.items():
            if dim in other:
                raise ConfigError("parallel", f"mesh dimension '{dim}' claimed twice ({other[dim]} and {size})")
            other[dim] = size
    non_dp = 1
    for size in other.values():
        non_dp *= size
    if world.size % non_dp:
        dims = " x ".join(f"{k}={v}" for k, v in other.items())
        raise ConfigError("parallel", f"the non-data-parallel degrees ({dims}) multiply to {non_dp}, which does not "
                          f"divide the world size {world.size}")
    dp_ranks = world.size // non_dp
    mesh: dict[str, int] = {"dp": dp_ranks}
    if dp:
        name = dp[0].split(".", 1)[1]
        plugin = reg.get("parallel", name)
        dp_mesh = getattr(plugin, "dp_mesh", None)
        if dp_mesh is not None:
            mesh = dp_mesh(run.parallel[name], dp_ranks, world)
    mesh.update(other)

    t = run.trainer
    per_step = t.micro_batch_size * dp_ranks
    if t.global_batch_size % per_step:
        raise ConfigError(
            "trainer.global_batch_size",
            f"{t.global_batch_size} sequences must be a multiple of trainer.micro_batch_size ({t.micro_batch_size}) "
            f"x data-parallel ranks ({dp_ranks}) = {per_step}")
    batch = BatchPlan(seq_len=run.data.seq_len, global_seqs=t.global_batch_size, micro_seqs=t.micro_batch_size,
                      dp_ranks=dp_ranks, grad_accum=t.global_batch_size // per_step)

    vocab = padded_vocab(run.data.tokenizer.vocab_size)
    base = count_params(run.model, vocab)
    extra = sum(c.params for c in contributions.values())
    extra_active = sum(c.active_params for c in contributions.values())
    params = ParamCounts(total=base.total + extra, embedding=base.embedding, active=base.active + extra_active)

    run_dir = _run_dir(run, now or datetime.now())
    resume_step = latest_checkpoint(run_dir) if run.trainer.resume else None

    from olmx.config.compose import as_dict

    return Plan(config=as_dict(run), world=world, mesh=mesh, batch=batch, params=params, vocab_size=vocab,
                run_dir=run_dir, resume_step=resume_step, sections=sections, olmx_version=__version__)


def _check_model(m: ModelConfig) -> None:
    for key in ("d_model", "n_layers", "n_heads", "hidden_size"):
        if getattr(m, key) < 1:
            raise ConfigError(f"model.{key}", f"must be a positive integer, got {getattr(m, key)}")
    if m.d_model % m.n_heads:
        raise ConfigError("model.n_heads", f"{m.n_heads} heads must divide model.d_model={m.d_model}")
    if m.n_kv_heads is not None and (m.n_kv_heads < 1 or m.n_heads % m.n_kv_heads):
        raise ConfigError("model.n_kv_heads", f"{m.n_kv_heads} must be positive and divide model.n_heads={m.n_heads}")
    if m.block not in BLOCKS:
        raise ConfigError("model.block", f"'{m.block}' is not one of {', '.join(BLOCKS)}")
    if m.attn_backend not in ATTN_BACKENDS:
        raise ConfigError("model.attn_backend", f"'{m.attn_backend}' is not one of {', '.join(ATTN_BACKENDS)}")


def _check_data(run: RunConfig, *, files_here: bool = True) -> None:
    """The data settings; with ``files_here`` also that ``data.paths`` exist and are readable."""
    d, tok = run.data, run.data.tokenizer
    if d.name not in DATA_SOURCES:
        raise ConfigError("data.name", f"'{d.name}' is not one of {', '.join(DATA_SOURCES)}")
    if d.seq_len < 2:
        raise ConfigError("data.seq_len", f"must be at least 2, got {d.seq_len}")
    for key in ("eos_id", "pad_id"):
        value = getattr(tok, key)
        if not 0 <= value < tok.vocab_size:
            raise ConfigError(f"data.tokenizer.{key}", f"{value} is outside the vocabulary [0, {tok.vocab_size})")
    if d.name == "stdlib":
        if not Path(sysconfig.get_paths()["stdlib"]).is_dir():
            raise ConfigError("data.name", "this Python has no standard-library sources; use data=text data.paths=[...]")
        if tok.name != "bytes":
            raise ConfigError("data.tokenizer.name", "data=stdlib is tokenized byte-level: use the bytes tokenizer")
        return
    if not d.paths:
        raise ConfigError("data.paths", f"data={d.name} needs at least one file: data.paths=[path/to/file,...]")
    for p in d.paths if files_here else []:
        matches = glob.glob(os.path.expanduser(p))
        if not matches:
            raise ConfigError("data.paths", f"'{p}' does not exist")
        for m in matches:
            if not os.access(m, os.R_OK):
                raise ConfigError("data.paths", f"'{m}' is not readable")
    if d.name == "text" and tok.name != "bytes":
        raise ConfigError("data.tokenizer.name", "data=text is tokenized byte-level: use the bytes tokenizer")


def _check_trainer(run: RunConfig) -> None:
    t = run.trainer
    for key in ("max_steps", "global_batch_size", "micro_batch_size", "save_interval", "log_interval"):
        if getattr(t, key) < 1:
            raise ConfigError(f"trainer.{key}", f"must be a positive integer, got {getattr(t, key)}")
    if t.stop_at_step is not None and not 0 < t.stop_at_step <= t.max_steps:
        raise ConfigError("trainer.stop_at_step", f"{t.stop_at_step} must be in [1, trainer.max_steps={t.max_steps}]")
    if t.lr <= 0:
        raise ConfigError("trainer.lr", f"must be positive, got {t.lr}")
    if t.warmup_steps < 0:
        raise ConfigError("trainer.warmup_steps", f"must be >= 0, got {t.warmup_steps}")
    if t.schedule not in SCHEDULES:
        raise ConfigError("trainer.schedule", f"'{t.schedule}' is not one of {', '.join(SCHEDULES)}")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError("trainer.betas", f"must be two numbers in [0, 1), got {list(t.betas)}")
    if t.on_nonfinite not in ("stop", "skip"):
        raise ConfigError("trainer.on_nonfinite", f"'{t.on_nonfinite}' is not one of stop, skip")
    if t.activation_checkpointing not in (None, *AC_MODES):
        raise ConfigError("trainer.activation_checkpointing",
                          f"'{t.activation_checkpointing}' is not one of {', '.join(AC_MODES)}, null")


def _run_dir(run: RunConfig, now: datetime) -> str:
    t = run.trainer
    if t.run_dir:
        path = Path(os.path.expanduser(t.run_dir)).absolute()
    else:
        path = (Path(t.runs_root).expanduser() / f"{now:%Y%m%d-%H%M%S}-{run.model.name}").absolute()
    _check_writable(path)
    return str(path)


def _check_writable(path: Path) -> None:
    """The run directory (or its nearest existing parent) must be a writable directory."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError("trainer.run_dir", f"'{probe}' exists and is not a directory")
    import tempfile

    try:  # an anonymous temporary file: works for root on read-only mounts, leaves nothing
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ConfigError("trainer.run_dir", f"'{probe}' is not writable ({exc.strerror})") from None


def describe_plan_rows(plan: Plan) -> list[tuple[str, str]]:
    """The core rows of a printed plan (plugins add their own sections)."""
    b, p, w = plan.batch, plan.params, plan.world
    mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.items())
    rows = [
        ("world", f"{w.size} processes = {w.nnodes} node(s) x {w.nproc_per_node} ({w.device_name})"),
        ("mesh", mesh),
        ("global batch", f"{b.global_seqs} sequences = {b.global_tokens:,} tokens"),
        ("micro batch / process", f"{b.micro_seqs} sequences = {b.micro_tokens:,} tokens"
                                  f"{f', {b.grad_accum} accumulation steps' if b.grad_accum > 1 else ''}"),
        ("parameters", f"{p.total:,} total, {p.non_embedding:,} non-embedding, {p.active:,} active"),
        ("vocabulary", f"{plan.vocab_size} (padded)"),
        ("run dir", plan.run_dir),
        ("resume", f"from step {plan.resume_step}" if plan.resume_step is not None else "no (fresh start)"),
    ]
    return rows


def plugin_config(plan: Plan, group: str, name: str) -> Any:
    """A plugin's settings from a plan, as plain data."""
    section = plan.config[group]
    return section if group == "infra" else section[name]
