"""What autograd saves for backward in one OLMo-core llama-like block, eager and ``torch.compile``d.

The plan's activation term (:mod:`olmx.plan.memory`) counts, per token and block, the bytes a
block keeps for its backward pass. Eager blocks save every op's inputs; under ``torch.compile``
AOTAutograd's min-cut partitioner (inductor's default) saves what is cheapest to keep and
recomputes element-wise work (norms, SiLU, RoPE, casts) in the backward graph, so a compiled block
keeps far less. This script counts both on CPU, for the blocks olmx builds
(:func:`olmx.worker.model.build_model_config`: OLMo-core's ``llama_like`` with ``reordered_norm``
and QK-norm as OLMo 3, or the pre-norm block; SwiGLU; the torch SDPA backend) at a few widths,
hidden sizes and kv-head counts, so that the coefficients of ``d``, ``kv`` and ``h`` can be read
off, and checks the compiled count against the memory model's compiled term.

How counted: one block of a 1-block model, a micro-batch of ``B x T`` tokens in the compute
dtype (``requires_grad`` like the output of the block before), run forward under
``torch.autograd.graph.saved_tensors_hooks``; every tensor the pack hook sees is counted once
per storage, except parameters and tensors without a token dimension (RoPE's sin/cos tables).
Under ``torch.compile`` the block's forward graph runs inside AOTAutograd's ``CompiledFunction``,
whose ``save_for_backward`` goes through the same hooks (checked: the hooks see as many tensors as
its backward node's ``saved_tensors`` holds). Precisions: ``bf16`` = bfloat16 parameters without
autocast (FSDP's mixed precision: OLMo-core casts the gathered parameters), ``fp32``, and
``autocast`` = float32 parameters under ``torch.autocast(bfloat16)`` (DDP's mixed precision).
Backends: ``inductor`` (what the worker compiles with) or ``aot_eager_decomp_partition`` (the
same decompositions and min-cut partitioner, no code generation: seconds instead of minutes on
CPU; the fast test uses it), chosen with ``--backend``.

Writes ``benchmarks/results/compiled_activations.json`` and the section of
``benchmarks/results/memory_model.md`` that starts at :data:`SECTION` (the rest of that file is
:mod:`benchmarks.memory_model`'s, which keeps this section when it rewrites the file).

    .venv/bin/python benchmarks/compiled_activations.py [--backend inductor] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
#: The heading of this script's section of ``memory_model.md``.
SECTION = "## Saved for backward per block: eager and torch.compile (OLMo-core blocks, saved-tensor hooks)"
#: Micro-batch of the count: 2 sequences of 192 tokens (no width below equals 192 or 384).
BATCH, SEQ = 2, 192


@dataclass(frozen=True)
class Case:
    """One block to count."""

    name: str
    d: int
    heads: int
    kv_heads: int
    hidden: int
    qk_norm: bool = True
    reordered: bool = True
    #: ``bf16`` (bfloat16 parameters, no autocast), ``fp32`` or ``autocast``.
    precision: str = "bf16"
    #: ``trainer.activation_checkpointing`` (None or ``long_context``).
    ac: str | None = None


CASES = [
    Case("d256 h768 MHA", 256, 4, 4, 768),
    Case("d256 h768 GQA 1 kv", 256, 4, 1, 768),
    Case("d256 h1024 MHA", 256, 4, 4, 1024),
    Case("d512 h1536 MHA", 512, 8, 8, 1536),
    Case("d512 h1536 GQA 2 kv", 512, 8, 2, 1536),
    Case("d256 h768 MHA no QK-norm", 256, 4, 4, 768, qk_norm=False),
    Case("d256 h768 MHA pre-norm", 256, 4, 4, 768, qk_norm=False, reordered=False),
    Case("d256 h768 MHA fp32", 256, 4, 4, 768, precision="fp32"),
    Case("d256 h768 MHA autocast", 256, 4, 4, 768, precision="autocast"),
    Case("d256 h768 MHA long_context", 256, 4, 4, 768, ac="long_context"),
]


def model_config(case: Case) -> Any:
    """The olmx model config of ``case``."""
    from olmx.config.schema import Block, ModelConfig

    return ModelConfig(
        d_model=case.d,
        n_layers=1,
        n_heads=case.heads,
        n_kv_heads=case.kv_heads if case.kv_heads != case.heads else None,
        hidden_size=case.hidden,
        block=Block.reordered_norm if case.reordered else Block.default,
        qk_norm=case.qk_norm,
    )


def build_block(case: Case, seq: int = SEQ) -> Any:
    """Block 0 of a 1-block OLMo-core model built as the worker builds it, on CPU, with its
    activation checkpointing applied as OLMo-core's train module applies it."""
    import torch

    from olmx.worker.model import build_model_config
    from olmx.worker.train import activation_checkpointing_config

    torch.manual_seed(0)
    model = build_model_config(model_config(case), vocab_size=384, attention="torch", seq_len=seq).build(
        init_device="cpu"
    )
    if case.ac is not None:
        ac = activation_checkpointing_config(case.ac)
        model.apply_activation_checkpointing(ac.mode, modules=ac.modules)
    block = model.blocks["0"]
    return block.to(torch.bfloat16) if case.precision == "bf16" else block


def saved(
    block: Any, case: Case, compiled: bool, batch: int = BATCH, seq: int = SEQ
) -> tuple[int, list[tuple[tuple[int, ...], str]], int]:
    """``(bytes per token, [(shape, dtype)] of what was counted, tensors the compiled backward
    node holds)`` that ``block`` saves for backward on one micro-batch (then runs the backward,
    so a compiled block's backward graph is compiled and used too)."""
    import contextlib

    import torch

    dtype = torch.float32 if case.precision == "fp32" else torch.bfloat16
    # the block's input: the previous block's output, in the compute dtype (float32 under autocast:
    # the residual stream stays in the parameters' dtype)
    x_dtype = torch.float32 if case.precision in ("fp32", "autocast") else dtype
    x = torch.randn(batch, seq, case.d, dtype=x_dtype, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, tuple[int, tuple[int, ...], str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        # a token dimension: (B, T, ...), (B, heads, T, ...) or (B * T, ...); not RoPE's (T, head) tables
        tokens = t.dim() >= 2 and (t.shape[0] == batch * seq or (t.shape[0] == batch and seq in t.shape[1:3]))
        if tokens and s.data_ptr() not in params:
            seen[s.data_ptr()] = (s.nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."))
        return t

    amp = torch.autocast("cpu", dtype=torch.bfloat16) if case.precision == "autocast" else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        y = block(x)
    held = len(getattr(y.grad_fn, "saved_tensors", ())) if compiled else 0
    y.float().square().mean().backward()
    total = sum(n for n, _, _ in seen.values())
    return total // (batch * seq), sorted((s, dt) for _, s, dt in seen.values()), held


def measure(case: Case, backend: str) -> dict[str, Any]:
    """Eager and compiled bytes per token of ``case``, and what the memory model estimates."""
    import torch

    eager, eager_shapes, _ = saved(build_block(case), case, compiled=False)
    block = build_block(case)
    torch._dynamo.reset()
    start = time.time()
    block.compile(fullgraph=False, backend=backend)  # as OLMo-core's block.apply_compile, with the backend
    comp, comp_shapes, held = saved(block, case, compiled=True)
    return {
        "case": asdict(case),
        "eager": eager,
        "compiled": comp,
        "compiled_hooked_vs_held": [len(comp_shapes), held],
        "model_eager": model_bytes(case, compiled=False),
        "model_compiled": model_bytes(case, compiled=True),
        "compile_s": round(time.time() - start, 1),
        "eager_saved": [f"{list(s)} {dt}" for s, dt in eager_shapes],
        "compiled_saved": [f"{list(s)} {dt}" for s, dt in comp_shapes],
    }


#: ``activation_checkpointing=budget``: blocks with OLMo 3 32B's and 7B's width ratios (feed-forward
#: 5.4 d with 8 query heads a kv head; 2.69 d with MHA; heads of 128), and the budgets counted.
BUDGET_CASES = [
    Case("OLMo 3 32B ratios: d640 h3456 GQA 1 kv", 640, 5, 1, 3456),
    Case("OLMo 3 7B ratios: d512 h1376 MHA", 512, 4, 4, 1376),
]
BUDGETS = (1.0, 0.9, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
#: Tokens of the budget count: 2 sequences of 1024.
BUDGET_SEQ = 1024


def measure_budget(case: Case, budget: float, seq: int = BUDGET_SEQ) -> dict[str, Any]:
    """What the min-cut partitioner keeps and recomputes for ``case`` compiled under
    ``torch._functorch.config.activation_memory_budget = budget`` (OLMo-core's ``mode=budget``):
    saved bytes per token (hooks, as :func:`saved`), the forward and backward graphs' matmul
    FLOPs (the backward's beyond twice the forward's are recomputed), and whether the backward
    graph runs the attention forward again; inductor's decompositions, no code generation."""
    import torch
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.compile_fx import select_decomp_table

    from olmx.plan.throughput import budget_recompute

    graphs: dict[str, Any] = {}

    def keep(name: str) -> Any:
        def compiler(gm: Any, _inputs: Any) -> Any:
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(
        fw_compiler=keep("forward"),
        bw_compiler=keep("backward"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    block = build_block(case, seq)
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget):
        block.compile(fullgraph=False, backend=backend)
        kept, _, _ = saved(block, case, compiled=True, seq=seq)
    torch._dynamo.reset()

    def matmuls(gm: Any) -> int:
        out = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and str(node.target) in ("aten.mm.default", "aten.addmm.default"):
                a, b = node.args[-2].meta["val"], node.args[-1].meta["val"]
                out += 2 * a.numel() * b.shape[-1]
        return out

    forward, backward = matmuls(graphs["forward"]), matmuls(graphs["backward"])
    attention = any(
        "scaled_dot_product" in str(n.target) and "backward" not in str(n.target)
        for n in graphs["backward"].graph.nodes
    )
    return {
        "name": case.name,
        "budget": budget,
        "kept": kept,
        "recomputed_matmul_share": round((backward - 2 * forward) / forward, 3),
        "attention_recomputed": attention,
        "forward_matmul_flops_per_token": forward // (BATCH * seq),
        "model_recompute_share": round(budget_recompute(forward, 0, budget) / forward, 3),
    }


#: The LM head's count: ``(d_model, vocabulary)``, 2 x 192 tokens (no width equals 384).
HEAD = (256, 4096)


def measure_head(compiled: bool) -> dict[str, Any]:
    """Bytes per token the LM head keeps for backward with the loss (OLMo-core's default loss, z-loss
    on, a ``sum`` reduction as the train module asks), bf16 parameters, eager or compiled
    (``aot_eager_decomp_partition``: the partitioner without code generation); and the plan's term
    of the logits' part (:data:`olmx.plan.memory.COMPILED_HEAD_LOGITS`, without their gradient)."""
    import torch

    from olmx.plan.memory import COMPILED_HEAD_LOGITS
    from olmx.worker.model import build_model_config

    d, vocab = HEAD
    case = Case("head", d, 4, 4, 3 * d)
    torch.manual_seed(0)
    model = build_model_config(model_config(case), vocab_size=vocab, attention="torch", seq_len=SEQ)
    head = model.build(init_device="cpu").lm_head.to(torch.bfloat16)
    torch._dynamo.reset()
    if compiled:
        head.compile(fullgraph=False, backend="aot_eager_decomp_partition")
    x = torch.randn(BATCH, SEQ, d, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (BATCH, SEQ))
    params = {p.untyped_storage().data_ptr() for p in head.parameters()}
    seen: dict[int, int] = {}
    logits = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal logits
        s = t.untyped_storage()
        if t.numel() >= BATCH * SEQ and s.data_ptr() not in params and s.data_ptr() not in seen:
            seen[s.data_ptr()] = s.nbytes()
            logits += s.nbytes() if t.shape[-1] == vocab else 0
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = head(x, labels=labels, loss_reduction="sum", z_loss_multiplier=1e-5, loss_div_factor=BATCH * SEQ)
    out.loss.backward()
    torch._dynamo.reset()
    tokens = BATCH * SEQ
    return {
        "compiled": compiled,
        "kept": sum(seen.values()) // tokens,
        "logits_per_entry": round(logits / tokens / vocab, 2),
        "model_logits_per_entry": COMPILED_HEAD_LOGITS * 2 if compiled else 8,
    }


def budget_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the budget rows (each compared with its block's budget-1 row)."""
    lines = [
        "| block | budget | saved B/token | plan's term | saved / term | matmuls recomputed | plan's share "
        "| attention recomputed |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['budget']:g} | {r['kept']} | {r['model']} | {r['kept'] / r['model']:.2f} "
            f"| {r['recomputed_matmul_share']:.0%} | {r['model_recompute_share']:.0%} "
            f"| {'yes' if r['attention_recomputed'] else 'no'} |"
        )
    return "\n".join(lines)


def head_rows(rows: list[dict[str, Any]]) -> str:
    """The LM head table's rows."""
    return "\n".join(
        f"| {'compiled' if r['compiled'] else 'eager'} | {r['kept']} | {r['logits_per_entry']:g} "
        f"| {r['model_logits_per_entry']} |"
        for r in rows
    )


def budget_rows() -> list[dict[str, Any]]:
    """Every :data:`BUDGET_CASES` block at every :data:`BUDGETS`, with the plan's term of what
    it keeps (:func:`olmx.plan.memory.budget_block_activations` of its budget-1 count)."""
    from olmx.plan.memory import budget_block_activations

    out = []
    for case in BUDGET_CASES:
        kept_all = None
        for budget in BUDGETS:
            r = measure_budget(case, budget)
            kept_all = r["kept"] if kept_all is None else kept_all
            r["model"] = budget_block_activations(kept_all, case.d * 2, budget)  # the block input: d in bf16
            out.append(r)
            print(
                f"{case.name:40} budget {budget:4} kept {r['kept']:6} (term {r['model']:6}) matmuls recomputed "
                f"{r['recomputed_matmul_share']:.0%} (plan {r['model_recompute_share']:.0%}) "
                f"attention {'recomputed' if r['attention_recomputed'] else 'kept'}",
                flush=True,
            )
    return out


def model_bytes(case: Case, compiled: bool) -> int:
    """The memory model's bytes per token of the block (attention + feed-forward parts, or the
    attention part and the feed-forward norm's input under ``long_context``)."""
    from olmx.plan.memory import COMPILED_LONG_CONTEXT_D, block_activations

    b = 4 if case.precision == "fp32" else 2  # the compute dtype (autocast: bfloat16)
    attn, ff, _ = block_activations(_Run(model_config(case)), b, case.precision == "autocast", compiled=compiled)
    if case.ac == "long_context":  # as olmx.plan.memory.estimate counts a kept block
        return attn + (COMPILED_LONG_CONTEXT_D * case.d * b if compiled else 0)
    return attn + ff


@dataclass(frozen=True)
class _Run:
    """What :func:`olmx.plan.memory.block_activations` reads of a run."""

    model: Any


def machine() -> str:
    """The record's provenance line."""
    import torch

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {platform.node() or 'this machine'}, "
        f"{os.cpu_count()} CPUs, load average {load}, torch {torch.__version__}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the measured rows."""
    lines = [
        "| block | precision | AC | eager: saved B/token | model | compiled: saved B/token | model "
        "| compiled / eager | compiled / model |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = r["case"]
        lines.append(
            f"| {r['name']} | {c['precision']} | {c['ac'] or '-'} | {r['eager']} | {r['model_eager']} "
            f"| {r['compiled']} | {r['model_compiled']} | {r['compiled'] / r['eager']:.2f} "
            f"| {r['compiled'] / r['model_compiled']:.2f} |"
        )
    return "\n".join(lines)


def section(record: dict[str, Any]) -> str:
    """This script's section of ``memory_model.md``."""
    rows = record["rows"]
    first = rows[0] if rows else None
    listing = (
        f"What the hooks saw for `{first['name']}` ({BATCH} x {SEQ} tokens), eager: "
        + ", ".join(first["eager_saved"])
        + "; compiled: "
        + ", ".join(first["compiled_saved"])
        + "."
        if first
        else ""
    )
    return f"""{SECTION}

Script: `.venv/bin/python benchmarks/compiled_activations.py --backend {record["backend"]}`. Recorded: {record["meta"]}.

Method: one block of a 1-block OLMo-core model built as the worker builds it
(`build_model_config`: `llama_like`, torch SDPA backend), {BATCH} sequences of {SEQ} tokens in the
compute dtype; the forward pass runs under `torch.autograd.graph.saved_tensors_hooks` and every
tensor with a token dimension that is not a parameter is counted once per storage (bytes per
token). Compiled: `block.compile(fullgraph=False)` as OLMo-core's `apply_compile`, backend
`{record["backend"]}`; AOTAutograd's `CompiledFunction` saves through the same hooks (the hooks saw
as many tensors as its backward node holds in every row). "model": `olmx.plan.memory.block_activations`
(attention + feed-forward part; the attention part alone under `long_context`, whose feed-forward
is recomputed), eager and compiled terms. bf16 = bfloat16 parameters without autocast (FSDP's
mixed precision), autocast = float32 parameters under `torch.autocast(bfloat16)`. Every block has
QK-norm and OLMo 3's reordered norms unless its name says otherwise.

{table(rows)}

{listing}

### The LM head with the loss (OLMo-core compiles it with the blocks)

d_model {HEAD[0]}, a vocabulary of {HEAD[1]}, {BATCH} x {SEQ} tokens, bf16 parameters, OLMo-core's
default loss with z-loss; "logits": the bytes per token and vocabulary entry of what it keeps with
a vocabulary dimension; "plan": the plan's term for them (it adds their gradient, in the same dtype).

| head | saved B/token | logits: B per entry | plan |
|---|---:|---:|---:|
{head_rows(record.get("head_rows", []))}

### `activation_checkpointing=budget` (OLMo-core's `mode=budget`, OLMo 3 32B's script: 0.5)

Each block compiled with inductor's decompositions and the min-cut partitioner under
`torch._functorch.config.activation_memory_budget` (what OLMo-core's budget mode sets), {BATCH} x
{BUDGET_SEQ} tokens, bf16. "saved": the hooks' count as above; "plan's term":
`olmx.plan.memory.budget_block_activations` of the block's budget-1 count (its input plus the
budget's share of the rest); "matmuls recomputed": the backward graph's matmul FLOPs beyond twice
the forward's, over the forward's; "plan's share": `olmx.plan.throughput.budget_recompute`'s (the
plan also counts the attention's forward as recomputed below a budget of 1). On CPU the attention
op has no FLOP count, so the partitioner prices its recompute at nothing (as flash-attn's custom op
on GPUs; torch's CUDA SDPA kernels are priced).

{budget_table(record.get("budget_rows", []))}

Recorded: {record.get("budget_meta", "not yet")}.

Reading: compiled, a block keeps its input, q and k before QK-norm, q, k and v after RoPE, the
attention output and SDPA's log-sum-exp, the output projection (the attention norm's input),
the residual after attention, the feed-forward's two h-wide projections and the product of the
gate (3 h), and the second projection's output (the feed-forward norm's input): every norm, RoPE,
SiLU, cast and residual add is recomputed from those in the backward graph, and the norms keep
only their float32 reciprocal RMS (4 bytes a token each). Eager keeps the norms' float32 input
and output, the SiLU output and the cast copies besides. Under autocast the compiled block keeps
its float32 input and residual and bf16 casts of them. Torch SDPA on CPU and flash-attn 2 on
GPUs save the same tensors for backward (q, k, v, the output, and a float32 log-sum-exp of
``4 x heads`` bytes a token; flash-attn also its RNG state, a few bytes a call); what differs is
grouped-query attention: OLMo-core's torch backend repeats k and v to every head before SDPA,
and flash-attn reads the kv heads as they are. The rows with GQA here were counted on the torch
backend.
"""


def write_section(record: dict[str, Any], out: Path) -> None:
    """Replace (or append) this script's section of ``memory_model.md``."""
    path = out / "memory_model.md"
    text = path.read_text() if path.exists() else ""
    head = text.split("\n" + SECTION)[0].rstrip("\n")
    path.write_text(f"{head}\n\n{section(record)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor: the worker's).")
    parser.add_argument("--only", nargs="+", help="Count only the cases whose name contains one of these.")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Where compiled_activations.json goes.")
    parser.add_argument(
        "--budget", action="store_true", help="Count only the LM head and the activation_checkpointing=budget rows."
    )
    args = parser.parse_args()
    path = args.out / "compiled_activations.json"
    partial = args.only or args.budget
    record = json.loads(path.read_text()) if path.exists() and partial else {"rows": []}
    if not args.budget:
        record.update(backend=args.backend, meta=machine())
    rows = {r["name"]: r for r in record["rows"]}
    for case in [] if args.budget else CASES:
        if args.only and not any(p in case.name for p in args.only):
            continue
        r = measure(case, args.backend)
        rows[case.name] = {"name": case.name, **r}
        print(
            f"{case.name:32} {case.precision:8} eager {r['eager']:6} (model {r['model_eager']:6})  "
            f"compiled {r['compiled']:6} (model {r['model_compiled']:6})  hooked/held {r['compiled_hooked_vs_held']}  "
            f"{r['compile_s']} s",
            flush=True,
        )
        record["rows"] = [rows[c.name] for c in CASES if c.name in rows]
        path.write_text(json.dumps(record, indent=1) + "\n")
        write_section(record, args.out)
    if not args.only:
        record.update(head_rows=[measure_head(False), measure_head(True)])
        print(head_rows(record["head_rows"]))
        record.update(budget_rows=budget_rows(), budget_meta=machine())
        path.write_text(json.dumps(record, indent=1) + "\n")
        write_section(record, args.out)
    print(table(record["rows"]))
    print(budget_table(record.get("budget_rows", [])))


if __name__ == "__main__":
    main()
