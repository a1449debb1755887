"""Memory per process, estimated from the plan before anything is launched (no torch).

What one training process holds at its peak (the backward pass of a step after the first,
when the optimizer state exists), in bytes:

* **parameters**: float32 master weights, ``4 * P / shard`` (FSDP-like layouts shard them
  over ``dp_shard`` ranks; DDP replicates them).
* **gradients**: float32, the same layout as the parameters. DDP adds its bucketed copy for
  the all-reduce (25 MiB buckets: bounded, counted as one bucket per process).
* **optimizer state**: AdamW's two float32 moments, ``8 * P / shard`` (SkipStepAdamW the same).
* **buffers**: the optimizer step's temporaries (about one more copy of the parameter shard,
  measured), DDP's bucket, and FSDP's gathered parameters in the compute dtype: two blocks
  at a time on GPUs (FSDP2 gathers a block and prefetches the next); on CPUs with gloo about
  one whole copy was measured.
* **activations** of one micro-batch of ``T = micro_seqs * seq_len / cp`` tokens, in the
  compute dtype ``b``: per block and token the tensors autograd keeps for backward, about
  ``(17 d + 2 kv + 5 h) * b`` for an OLMo-core llama-like block (norm inputs and outputs,
  q/k/v before and after RoPE and QK-norm, the attention output, the SwiGLU's three
  ``h``-wide inputs and outputs and its product; the constants are fitted to measured peaks);
  with ``activation_checkpointing=full`` only each block's input (``d * b``) is kept, plus one
  block recomputed in backward together with its gradients (two blocks' worth); with
  ``long_context`` the attention part is kept and the feed-forward part recomputed. The
  output layer adds the logits and their gradient in float32 (``2 * 4 * T * V``) and the
  embedding output. Attention runs in a memory-efficient kernel (no ``T^2`` term).

The estimate is compared with measured peaks by ``benchmarks/memory_model.py`` (CPU: resident
memory above the process's baseline; GPU: ``torch.cuda.max_memory_allocated``); the numbers
are in ``benchmarks/RESULTS.md``. Device capacity comes from the infra plugin's
:class:`~olmx.api.World` (``device_memory_gib``).
"""

from __future__ import annotations

from dataclasses import dataclass

from olmx.api import Mesh, World
from olmx.config.schema import RunConfig

GIB = 1 << 30
#: DDP's gradient bucket (torch's default ``bucket_cap_mb=25``).
DDP_BUCKET = 25 << 20
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process at the peak of a training step."""

    params: int
    grads: int
    optimizer: int
    activations: int
    #: Activations without any activation checkpointing (for the plan's comparison).
    activations_no_ac: int
    #: Communication and gather buffers (FSDP's gathered block, DDP's bucket).
    buffers: int

    @property
    def peak(self) -> int:
        """The estimated peak."""
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


def estimate(
    run: RunConfig,
    mesh: Mesh,
    total_params: int,
    vocab: int,
    param_dtype: str,
    device: str = "cuda",
    sharded: tuple[tuple[int, int], ...] = (),
) -> MemoryEstimate:
    """The estimate for one process of the run on ``device`` (see the module docstring);
    ``sharded`` lists ``(parameters, ranks)`` that plugins spread over ranks themselves
    (:attr:`olmx.api.Contribution.sharded_params`)."""
    m, t = run.model, run.trainer
    b = _DTYPE_BYTES.get(param_dtype, 4)
    shard = mesh.dp_shard if mesh.shards_params else 1
    own = sum(n for n, _ in sharded)
    params = 4 * (total_params - own) // shard + sum(4 * n // max(1, over) for n, over in sharded)
    total_params -= own  # what DDP/FSDP hold
    grads = params
    optimizer = 2 * params
    d, h = m.d_model, m.hidden_size
    kv = d * (m.n_kv_heads or m.n_heads) // m.n_heads
    tokens = t.micro_batch_size * run.data.seq_len // max(1, mesh.cp)
    attn = (14 * d + 2 * kv + (2 * d if m.qk_norm else 0)) * b
    ff = (3 * d + 5 * h) * b
    block = tokens * (attn + ff)
    head = tokens * (2 * d * b + 2 * 4 * vocab)
    no_ac = m.n_layers * block + head
    ac = t.activation_checkpointing
    if ac == "full":  # block inputs, and one block recomputed in backward with its gradients
        acts = m.n_layers * tokens * d * b + 2 * block + head
    elif ac == "long_context":
        acts = m.n_layers * tokens * (attn + d * b) + 2 * tokens * ff + head
    else:
        acts = no_ac
    per_block = 4 * (total_params - 2 * vocab * d) // max(1, m.n_layers)
    if mesh.shards_params:  # FSDP2: two blocks gathered on GPUs; on CPUs (gloo) a whole copy was measured
        comm = (per_block * 2 if device == "cuda" else 4 * total_params) * b // 4
    else:
        comm = DDP_BUCKET if mesh.dp > 1 else 0
    buffers = comm + params  # + the optimizer step's temporaries: about one more copy of the shard
    return MemoryEstimate(params, grads, optimizer, acts, no_ac, buffers)


def gib(n: int | float) -> str:
    """``n`` bytes for the plan: GiB, or MiB below one GiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


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
    cap = world.device_memory_gib
    where = f"of {cap:.0f} GiB per process ({world.device_name})" if cap else "(device memory unknown)"
    out.append(("estimated peak", f"{gib(est.peak)} {where}"))
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
) -> list[str]:
    """ConfigError when the estimated peak exceeds a GPU's memory, naming the cheapest change
    that fits; on CPUs (RAM shared with the system, swap) a warning instead (returned)."""
    from dataclasses import replace

    from olmx.errors import ConfigError

    cap = world.device_memory_gib
    if cap is None or est.peak <= cap * GIB:
        return []
    t = run.trainer
    tries: list[tuple[str, RunConfig, Mesh]] = []
    if t.activation_checkpointing is None:
        tries.append(
            (
                "trainer.activation_checkpointing=full",
                replace(run, trainer=replace(t, activation_checkpointing="full")),
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
            if (e := estimate(r, m, total_params, vocab, param_dtype, world.device, sharded)).peak <= cap * GIB
        ),
        "more processes to shard over, a smaller model or a shorter data.seq_len",
    )
    message = (
        f"estimated peak {gib(est.peak)} per process (parameters {gib(est.params)}, gradients {gib(est.grads)}, "
        f"optimizer {gib(est.optimizer)}, activations {gib(est.activations)}, buffers {gib(est.buffers)}) is more "
        f"than the {cap:.1f} GiB of {world.device_name}; cheapest change that fits: {fix}"
    )
    if world.device == "cuda":
        raise ConfigError("memory", message)
    return [message]
