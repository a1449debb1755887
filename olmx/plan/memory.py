"""Memory per process, estimated from the plan before anything is launched (no torch).

What one training process holds at its peak, in bytes: the live tensors, which is what
``torch.cuda.max_memory_allocated`` counts on a GPU and resident memory shows on a CPU when
glibc returns freed blocks to the system (``MALLOC_MMAP_THRESHOLD_=65536``; with glibc's
default heap a CPU process keeps freed activation blocks and shows up to 2x more, see
``benchmarks/results/memory_model.md``). The same terms on every device:

* **parameters**: float32 master weights, ``4 * P / shard`` (FSDP-like layouts shard them
  over ``dp_shard x cp`` ranks, as OLMo-core folds context parallelism into data parallelism
  for the parameters; DDP replicates them; what a plugin shards itself, such as sharded
  Engram tables or experts under ``ddp_ep``, counts once per rank of its group:
  :attr:`olmx.api.Contribution.sharded_params`).
* **gradients**: float32, the same layout as the parameters.
* **optimizer state**: AdamW's two float32 moments, ``8 * P / shard`` (SkipStepAdamW the same).
* **activations** of one micro-batch of ``T = micro_seqs * seq_len / cp`` tokens, in the
  compute dtype ``b``, per block and token what autograd saves for backward in an OLMo-core
  llama-like block, counted with saved-tensor hooks (:data:`ATTN_D`, :data:`FF_D`,
  :data:`FF_H`): ``(6 d + 2 kv) b`` in the attention part (``(d + kv) b`` more with QK-norm)
  and ``(2 d + 4 h) b`` in the feed-forward; while a block runs backward its ``2 h`` wide
  gradients are alive too (:data:`TRANSIENT_H`). Under ``torch.autocast`` (bf16 over
  replicated float32 parameters) the residual stream and the norms stay float32 and the
  linears read bf16 casts of their inputs: ``14 d`` bytes more per block than pure bf16
  (:data:`AUTOCAST_D`). With low-precision weights and no autocast (FSDP's bf16 parameters)
  each RMSNorm still normalizes in float32 and keeps its input and output in float32,
  ``4`` bytes an element of every norm more (:data:`NORM_FLOAT32`: the two block norms, and
  q's and k's with QK-norm). ``activation_checkpointing=full`` keeps each block's input and one
  block recomputed at a time; ``long_context`` keeps what the attention part does, except the
  norm's inner tensor, which it exchanges for the feed-forward norm's input, and recomputes
  the feed-forward one block at a time. ``budget`` (compiled blocks only) keeps each block's
  input plus ``trainer.activation_memory_budget`` of the rest of what a compiled block keeps
  (:func:`budget_block_activations`), the rest recomputed one block at a time. The output layer
  adds the logits and their gradient in float32 (``2 * 4 * T * V``; compiled, in the compute dtype:
  :data:`COMPILED_HEAD_LOGITS`) and the embedding output. Attention runs in a memory-efficient
  kernel (no ``T^2`` term). Plugins add what their own modules keep
  (:attr:`~olmx.api.Contribution.activation_bytes_per_token`: Ulysses' output in sequence
  layout and replicated kv heads, the MoE's routed copies and router, Engram's rows).
* **buffers**: the larger of what is alive with the activations (FSDP2's gathered parameters
  in the compute dtype, a block and the prefetched next one, or the whole model where they stay
  gathered from the forward to the backward, ZeRO-2's :attr:`~olmx.api.Mesh.reshard_after_forward`
  off; what plugins gather themselves, :attr:`~olmx.api.Contribution.gathered_params`;
  autocast's bf16 weight copies, 2
  bytes a parameter, kept for backward) and the optimizer step's temporaries (one more copy of
  the parameter shard) less the activations, which are freed by then. DDP's buckets are the
  gradients themselves (a 2-process DDP run measured the same as one process), and a layer's
  transient communication (all-to-all, gathered rows) is freed before the peak at the start of
  the backward pass.

Measured against 21 real runs on CPU (``benchmarks/memory_model.py``, recorded in
``benchmarks/results/memory_model.md``: ddp, fsdp, hsdp, ddp_ep, Ulysses degree 1/2/4 with
replicated kv heads, no/full/long_context checkpointing, fp32 and bf16, MoE and Engram with
replicated and sharded tables). The terms were chosen on 12 of them (measured / estimate
0.92-1.02; two of those 12 were held out first and missed, 0.87 with ``long_context`` and 0.71
with FSDP over Ulysses, which led to the ``long_context`` recount and the ``dp_shard x cp``
sharding) and predict the 9 others at 0.91-1.12 (the worst: MoE under full checkpointing,
whose recomputed block is an MoE block, 1.12). Two pipeline rows added later (2 processes,
ddp x pp 2, 4 micro-batches a step) are predicted too: 0.99 under 1F1B (2 in flight), 0.96 under
GPipe (4 in flight). Under pipeline parallelism a process holds its stage, ``ceil(blocks / pp)``
blocks and one vocab x d matrix, and keeps its blocks' activations of every micro-batch the
schedule has in flight (:attr:`~olmx.api.Contribution.microbatches_in_flight`). The norms'
float32 copies were found later, by
``tests/plan/test_layouts_at_scale.py`` (OLMo 3 with QK-norm in bf16 under FSDP at 64 ranks measured
1.26-1.29x the estimate without them, 1.02-1.06x with them). Not measured on a GPU yet: the script measures
``torch.cuda.max_memory_allocated`` where CUDA is present (``MEMORY_MODEL=1
benchmarks/gpu/smoke.sh``). Device capacity comes from the infra plugin's
:class:`~olmx.api.World` (``device_memory_gib``).
"""

from __future__ import annotations

from dataclasses import dataclass

from olmx.config.schema import ActivationCheckpointing, RunConfig
from olmx.types import FF_H, Mesh, World

GIB = 1 << 30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
#: d-wide tensors per token an attention part keeps (the block input, the norm's output, q
#: before RoPE, the attention output, ...; plus ``2 kv`` for k and v), counted with autograd's
#: saved-tensor hooks on an OLMo-core block.
ATTN_D = 6
#: d-wide tensors per token a SwiGLU feed-forward part keeps (its norm's input and output;
#: the h-wide ones are :data:`olmx.api.FF_H`).
FF_D = 2
#: h-wide gradients alive while one block runs backward (measured: grows with tokens, not depth).
TRANSIENT_H = 2
#: Bytes per d per block part that autocast adds: the residual stream and the norms stay
#: float32, the linears read bf16 casts of their inputs (saved-tensor count: 14 d per block).
AUTOCAST_D = 7
#: Bytes per element of a norm's input that OLMo-core's RMSNorm keeps beyond the two tensors of
#: the compute dtype counted, when the weights are in a lower precision without autocast (FSDP's
#: bf16 parameters): it normalizes in float32 and saves its input and output in float32 for
#: backward (saved-tensor count on its RMSNorm: 8 bytes an element in bfloat16, as in float32).
NORM_FLOAT32 = 4
#: d-wide tensors per token a ``torch.compile``d attention part keeps, in the compute dtype: the
#: block input, q after RoPE, the attention output and the output projection (the attention norm's
#: input), plus ``2 kv`` for k after RoPE and v, and with QK-norm q's and k's inputs (``d + kv``).
#: AOTAutograd's min-cut partitioner recomputes every norm, RoPE, SiLU, cast and residual add in
#: the backward graph, so no float32 norm copies (:data:`NORM_FLOAT32`) and, on OLMo 3's reordered
#: norms, no autocast copies (:data:`AUTOCAST_D`) are kept; the norms' float32 reciprocal RMS and
#: the attention's log-sum-exp (``4`` bytes a token per norm and per head) are left out. Counted
#: with saved-tensor hooks on OLMo-core blocks compiled with inductor and with
#: ``aot_eager_decomp_partition`` (the same partitioner; identical counts), on CPU
#: (``benchmarks/compiled_activations.py``, ``benchmarks/results/memory_model.md``).
COMPILED_ATTN_D = 4
#: d-wide tensors per token a ``torch.compile``d feed-forward part keeps: its input (the residual
#: after attention) and its output (the feed-forward norm's input).
COMPILED_FF_D = 2
#: h-wide tensors per token a ``torch.compile``d SwiGLU keeps: the two projections and the gated
#: product (eager keeps the SiLU output too: :data:`olmx.api.FF_H` = 4).
COMPILED_FF_H = 3
#: d-wide tensors per token a ``torch.compile``d block keeps beyond its attention part under
#: ``activation_checkpointing=long_context`` (the feed-forward's and the norms' inputs, less what
#: the partitioner shares: one ``d``, counted).
COMPILED_LONG_CONTEXT_D = 1
#: Logits-sized tensors, in the compute dtype, that a ``torch.compile``d LM head with the loss
#: (OLMo-core compiles it with the blocks) keeps for backward: the logits themselves; the float32
#: log-softmax and its input, which the eager head keeps (8 bytes a vocabulary entry), are
#: recomputed. Counted with saved-tensor hooks (``benchmarks/compiled_activations.py``: 2 bytes a
#: vocabulary entry and token in bf16, 8 eager). The plan adds their gradient, in the same dtype.
COMPILED_HEAD_LOGITS = 1
#: The optimizer step's temporaries, in copies of the parameter shard (foreach AdamW).
OPTIMIZER_TEMPORARIES = 1


#: GiB of a GPU that no tensor of the run can use: the CUDA context (~0.5 GiB on Hopper with
#: torch's kernels loaded), NCCL's channel and proxy buffers (~0.3-1 GiB, more with more peers
#: and with NVLink SHARP), cuBLAS/cuBLASLt workspaces (32 MiB a stream on Hopper) and Triton's
#: and inductor's loaded kernels. The estimate counts live tensors only.
CUDA_RESERVED_GIB = 2.0
#: The share of what is left that the caching allocator can lose to fragmentation (blocks
#: reserved but not reusable at the peak); small with expandable segments, which the worker
#: turns on (:func:`olmx.worker.run.worker_environment`).
FRAGMENTATION = 0.05


def usable_gib(world: World) -> float | None:
    """Memory of one process's device that a run's tensors can fill (None: unknown): a GPU's
    memory less :data:`CUDA_RESERVED_GIB`, less :data:`FRAGMENTATION` of the rest; on CPUs, the
    process's share of the host's RAM as the infra plugin gives it."""
    cap = world.device_memory_gib
    if cap is None or world.device != "cuda":
        return cap
    return max(cap - CUDA_RESERVED_GIB, 0.0) * (1 - FRAGMENTATION)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process at the peak of a training step."""

    params: int
    grads: int
    optimizer: int
    activations: int
    #: Activations without any activation checkpointing (for the plan's comparison).
    activations_no_ac: int
    #: FSDP's gathered parameters and autocast's low-precision weight copies, or the optimizer
    #: step's temporaries where those are larger than the activations (which are freed by then).
    buffers: int
    #: What the plugins' modules keep per token (summed
    #: :attr:`olmx.api.Contribution.activation_bytes_per_token`), to estimate a changed run with.
    plugin_activations: int = 0
    #: Parameters the plugins gather for compute (summed
    #: :attr:`olmx.api.Contribution.gathered_params`), to estimate a changed run with.
    plugin_gathered: int = 0
    #: Micro-batches in flight (the largest :attr:`olmx.api.Contribution.microbatches_in_flight`).
    inflight: int = 1
    #: The blocks run ``torch.compile``d (:attr:`olmx.plan.execution.Execution.compile`).
    compiled: bool = False

    @property
    def plugin_terms(self) -> tuple[int, int, int]:
        """``(plugin_activations, plugin_gathered, inflight)``, as :func:`estimate` takes them."""
        return self.plugin_activations, self.plugin_gathered, self.inflight

    @property
    def peak(self) -> int:
        """The estimated peak."""
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


def block_activations(run: RunConfig, b: int, autocast: bool, compiled: bool = False) -> tuple[int, int, int]:
    """Bytes per token of one llama-like block: ``(attention part, feed-forward part, backward
    transient)`` (see the module docstring); ``compiled``: the block runs ``torch.compile``d."""
    m = run.model
    d, h = m.d_model, m.hidden_size
    kv = d * (m.n_kv_heads or m.n_heads) // m.n_heads
    if compiled:
        return compiled_block_activations(d, kv, h, m.qk_norm, b)
    attn = (ATTN_D * d + 2 * kv + ((d + kv) if m.qk_norm else 0)) * b
    ff = (FF_D * d + FF_H * h) * b
    if autocast:  # the residual stream and the norms stay float32; the linears read bf16 casts
        attn += AUTOCAST_D * d
        ff += AUTOCAST_D * d
    elif b < 4:  # low-precision weights: each RMSNorm keeps a float32 copy of its input too
        attn += NORM_FLOAT32 * (d + ((d + kv) if m.qk_norm else 0))
        ff += NORM_FLOAT32 * d
    return attn, ff, TRANSIENT_H * h * b


def compiled_block_activations(d: int, kv: int, h: int, qk_norm: bool, b: int) -> tuple[int, int, int]:
    """:func:`block_activations` of a ``torch.compile``d block (:data:`COMPILED_ATTN_D`,
    :data:`COMPILED_FF_D`, :data:`COMPILED_FF_H`): the same under autocast, whose casts are
    recomputed (counted: bf16 parameters and float32 ones under autocast keep the same bytes)."""
    attn = (COMPILED_ATTN_D * d + 2 * kv + ((d + kv) if qk_norm else 0)) * b
    ff = (COMPILED_FF_D * d + COMPILED_FF_H * h) * b
    return attn, ff, TRANSIENT_H * h * b


def budget_block_activations(block: int, block_input: int, budget: float) -> int:
    """Bytes per token a compiled block keeps under ``activation_checkpointing=budget``: torch's
    partitioner (``torch._functorch.config.activation_memory_budget``) keeps the block's inputs
    and at most ``budget`` of the rest of what it keeps without a budget (``block``), choosing
    what to recompute by FLOPs. Counted on CPU at OLMo 3 7B's and 32B's width ratios
    (``benchmarks/compiled_activations.py``, ``benchmarks/results/memory_model.md``): 0.79-1.07x
    this at budgets 0.2-0.9, 1.05x at OLMo 3 32B's 0.5 (what it keeps comes in whole tensors, so
    a budget between two of them keeps a little more or less)."""
    return block_input + int(budget * max(0, block - block_input))


def estimate(
    run: RunConfig,
    mesh: Mesh,
    total_params: int,
    vocab: int,
    param_dtype: str,
    device: str = "cuda",
    sharded: tuple[tuple[int, int], ...] = (),
    plugin_activations: int = 0,
    plugin_gathered: int = 0,
    inflight: int = 1,
    compiled: bool = False,
) -> MemoryEstimate:
    """The estimate for one process of the run (see the module docstring: the same terms on
    every ``device``, whose capacity :func:`check` compares it with); ``sharded`` lists
    ``(parameters, ranks)`` that plugins spread over ranks themselves
    (:attr:`olmx.api.Contribution.sharded_params`), ``plugin_activations`` the bytes per token
    their modules keep (:attr:`olmx.api.Contribution.activation_bytes_per_token`, summed) and
    ``plugin_gathered`` the parameters they gather for compute (:attr:`~olmx.api.Contribution.gathered_params`)
    and ``inflight`` the micro-batches a pipeline stage keeps activations of; ``compiled``: the
    blocks run ``torch.compile``d (:func:`compiled_block_activations`; False: eager, as counted
    first)."""
    m, t = run.model, run.trainer
    b = _DTYPE_BYTES.get(param_dtype, 4)
    autocast = b < 4 and not mesh.shards_params  # replicated parameters: torch.autocast
    # OLMo-core flattens the context-parallel ranks into the last data-parallel dimension
    # (``dp_cp``): FSDP shards over dp_shard x cp
    # tensor parallelism slices every weight (embedding, blocks, head) over tp ranks; the norms'
    # few parameters stay whole and are not counted apart
    shard = (mesh.dp_shard * max(1, mesh.cp) if mesh.shards_params else 1) * mesh.tp
    own = sum(n for n, _ in sharded)
    d = m.d_model
    per_block = 4 * (total_params - own - 2 * vocab * d) // max(1, m.n_layers)
    held = total_params - own  # what DDP/FSDP hold
    # pipeline parallelism: the busiest stage holds ceil(blocks / pp) blocks and one vocab x d
    # matrix (the first stage the embedding, the last the output head)
    stage_layers = -(-m.n_layers // mesh.pp)
    if mesh.pp > 1:
        held = (held - 2 * vocab * d) * stage_layers // m.n_layers + vocab * d
    # the parameters plugins place themselves (experts) belong to blocks: a stage holds its share
    own_held = sum(4 * n // max(1, over) for n, over in sharded) * stage_layers // m.n_layers
    params = 4 * held // shard + own_held
    total_params = held
    grads = params
    optimizer = 2 * params
    # tensor parallelism with sequence-parallel norms: each rank keeps 1/tp of a block's
    # activations (its heads and feed-forward slice; 1/tp of the positions around the norms)
    tokens = t.micro_batch_size * run.data.seq_len // (max(1, mesh.cp) * mesh.tp)
    attn, ff, transient = block_activations(run, b, autocast, compiled)
    # plugins' activations belong to blocks too: a stage keeps its share, for every micro-batch in flight
    plugin_acts = tokens * plugin_activations * stage_layers * inflight // m.n_layers
    # the output layer: its logits and their gradient, float32 in eager blocks; compiled (OLMo-core
    # compiles the LM head with the blocks), the loss's float32 work is recomputed and the logits
    # are kept in the compute dtype (COMPILED_HEAD_LOGITS)
    logits = (COMPILED_HEAD_LOGITS + 1) * b if compiled else 2 * 4  # bytes a vocabulary entry, with the gradient
    head = tokens * (2 * d * b + logits * vocab)
    # a pipeline stage keeps its blocks' activations of every micro-batch in flight; the output
    # layer's (the last stage's) of one at a time
    kept = stage_layers * inflight
    no_ac = kept * tokens * (attn + ff) + tokens * transient + head + plugin_acts
    ac = t.activation_checkpointing
    if ac == "full":  # block inputs, and one block recomputed in backward
        acts = kept * tokens * d * b + tokens * (attn + ff + transient) + head + plugin_acts
    elif ac == "budget":  # the partitioner's share of each block, the rest recomputed one block at a time
        kept_block = budget_block_activations(attn + ff, d * b, t.activation_memory_budget)
        acts = kept * tokens * kept_block + tokens * (attn + ff - kept_block + transient) + head + plugin_acts
    elif ac == "long_context":  # feed-forward and norms recomputed (their inputs kept), one at a time
        # per block the attention part less its norm's inner tensor, plus the feed-forward
        # norm's input (saved-tensor count: 8 d-wide tensors per block with MHA, not 10)
        # (compiled: the attention part and one d of the feed-forward's and norms' inputs)
        lc = attn + (COMPILED_LONG_CONTEXT_D * d * b if compiled else 0)
        acts = kept * tokens * lc + tokens * (ff + transient) + head + plugin_acts
    else:
        acts = no_ac
    # FSDP2 gathers a block and prefetches the next, in the compute dtype; DDP's buckets are the
    # gradients (a 2-process DDP run measured the same as one process)
    # (ZeRO-2, parameters kept gathered from the forward to the backward: the whole model)
    if mesh.shards_params:  # (each rank gathers its tensor-parallel slice)
        comm = (2 * per_block * b // 4 if mesh.reshard_after_forward else total_params * b) // mesh.tp
    else:
        comm = 0
    comm += plugin_gathered * b
    copies = 2 * total_params if autocast else 0  # autocast's bf16 weight copies, kept for backward
    step = OPTIMIZER_TEMPORARIES * params  # the optimizer step's temporaries, after backward
    buffers = max(comm + copies, step - acts)
    return MemoryEstimate(
        params, grads, optimizer, acts, no_ac, buffers, plugin_activations, plugin_gathered, inflight, compiled
    )


def gib(n: int | float) -> str:
    """``n`` bytes for the plan: GiB, or MiB below one GiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


#: The label of the estimated peak in the plan's ``memory`` section, and what it counts.
PEAK_ROW = "estimated peak"
#: What a run's measured peak is compared with the estimate as (the plan's ``measured as`` row;
#: ``olmx report`` shows the ratio): device type -> how.
MEASURED_AS = {
    "cuda": "allocator peak (torch.cuda.max_memory_allocated: live tensors, as estimated)",
    "cpu": "process RSS above its start (the estimate's live tensors plus freed blocks the heap keeps, up to 2x; "
    "torch and OLMo-core hold ~0.5 GiB before the model, not counted)",
}


def peak_of(rows: list[tuple[str, str]] | list[list[str]]) -> int | None:
    """The estimated peak in bytes, read back from the plan's ``memory`` section (:func:`rows`;
    None where it has none), for the report's comparison with the measured peak."""
    text = dict((row[0], row[1]) for row in rows).get(PEAK_ROW)
    if not text:
        return None
    number, _, unit = text.partition(" ")
    try:
        return int(float(number) * (GIB if unit.startswith("GiB") else 1 << 20))
    except ValueError:
        return None


def rows(est: MemoryEstimate, world: World) -> list[tuple[str, str]]:
    """The plan's ``memory`` section."""
    ac = "" if est.activations == est.activations_no_ac else f" ({gib(est.activations_no_ac)} without checkpointing)"
    out = [
        ("parameters", gib(est.params)),
        ("gradients", gib(est.grads)),
        ("optimizer state", gib(est.optimizer)),
        ("activations", gib(est.activations) + ac),
        ("buffers", gib(est.buffers)),
    ]
    cap, usable = world.device_memory_gib, usable_gib(world)
    if cap is None or usable is None:
        where = "(device memory unknown)"
    elif usable == cap:
        where = f"of {cap:.0f} GiB per process ({world.device_name})"
    else:
        where = (
            f"of {usable:.1f} GiB usable per process ({world.device_name}: {cap:.0f} GiB less "
            f"{CUDA_RESERVED_GIB:g} GiB for the CUDA context, NCCL and cuBLAS, less {FRAGMENTATION:.0%} "
            "for fragmentation)"
        )
    out.append((PEAK_ROW, f"{gib(est.peak)} live tensors {where}"))
    out.append(("measured as", MEASURED_AS["cuda" if world.device == "cuda" else "cpu"]))
    return out


def check(
    est: MemoryEstimate,
    run: RunConfig,
    mesh: Mesh,
    world: World,
    total_params: int,
    vocab: int,
    param_dtype: str,
    sharded: tuple[tuple[int, int], ...] = (),
    ran_here: str | None = None,
) -> list[str]:
    """ConfigError when the estimated peak exceeds the memory a process can use (a GPU's less its
    headroom, or on CPUs its share of the host's RAM: the kernel would kill the workers), naming
    the cheapest change that fits. Returns the warnings: the same message as a warning where
    ``ran_here`` says the run's source trains this very layout on this GPU
    (:func:`olmx.plan.reference.recipe_ran_here`), whose evidence outranks the estimate."""
    from dataclasses import replace

    from olmx.errors import ConfigError

    cap = usable_gib(world)
    if cap is None or est.peak <= cap * GIB:
        return []
    t = run.trainer
    tries: list[tuple[str, RunConfig, Mesh]] = []
    if t.activation_checkpointing is None:
        tries.append(
            (
                "trainer.activation_checkpointing=full",
                replace(run, trainer=replace(t, activation_checkpointing=ActivationCheckpointing.full)),
                mesh,
            )
        )
    micro = t.micro_batch_size
    while micro > 1:
        micro //= 2
        tries.append(
            (f"trainer.micro_batch_size={micro}", replace(run, trainer=replace(t, micro_batch_size=micro)), mesh)
        )
    if mesh.dp > 1 and not mesh.shards_params:
        fsdp_mesh = replace(mesh, dp_replicate=1, dp_shard=mesh.dp, shards_params=True)
        tries.append(("parallel=[fsdp] (shard parameters, gradients and optimizer state)", run, fsdp_mesh))
    fix = next(
        (
            f"{change} (estimated {gib(e.peak)})"
            for change, r, m in tries
            if (
                e := estimate(
                    r, m, total_params, vocab, param_dtype, world.device, sharded, *est.plugin_terms, est.compiled
                )
            ).peak
            <= cap * GIB
        ),
        "more processes to shard over, a smaller model or a shorter data.seq_len",
    )
    message = (
        f"estimated peak {gib(est.peak)} per process (parameters {gib(est.params)}, gradients {gib(est.grads)}, "
        f"optimizer {gib(est.optimizer)}, activations {gib(est.activations)}, buffers {gib(est.buffers)}) is more "
        f"than the {cap:.1f} GiB usable of {world.device_name}"
        + (f" ({world.device_memory_gib:.1f} GiB less headroom)" if cap != world.device_memory_gib else "")
        + ("" if world.device == "cuda" else " (its share of the host's RAM: the kernel would kill the workers)")
        + f"; cheapest change that fits: {fix}"
    )
    if ran_here:
        return [f"{message}. Not refused: {ran_here}"]
    raise ConfigError("memory", message)
