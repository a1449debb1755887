"""Ulysses on CPU: longest trainable sequence under a per-process memory cap, step time at
equal total tokens, and what the ``long_context`` activation-checkpointing policy saves.

Model: an OLMo-core llama-like transformer (d_model 256, 4 layers, 8 heads of 32 dims, SwiGLU
hidden 1024, byte-level vocabulary padded to 384, fp32, torch SDPA), AdamW; one training step
= forward + backward + optimizer step on one sequence (the Ulysses group shares it: each of
P ranks holds S/P tokens). Ulysses is olmx's: the attention wrapper
(``olmx_plugins.parallel.ulysses_attention``) plus OLMo-core's context-parallel sharding of
inputs, labels and RoPE over a gloo group; activation checkpointing is applied with the
config ``olmx.worker.train.activation_checkpointing_config`` maps the trainer option to.

Memory measurement: the peak resident set size of each process (``VmHWM`` in
``/proc/self/status``), reset before every measured step by writing ``5`` to
``/proc/self/clear_refs``, so each step's peak is its own; the step's figure is the maximum
over the group's processes. It is the whole process: Python, torch and OLMo-core, the model,
gradients, AdamW state, activations, communication buffers. glibc is told to serve every
allocation above 64 KiB with mmap (``MALLOC_MMAP_THRESHOLD_=65536``), so freed tensors go back
to the OS and a step does not inherit the previous step's heap. A sequence "fits" when that
peak is at most the cap. The search doubles S from 512 until a step exceeds the cap, then
bisects to a multiple of 256 tokens. Each configuration runs in fresh processes.

    python benchmarks/ulysses.py [--cap-mib 1024] [--equal-tokens 4096] [--ac-tokens 4096]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the spawned workers

GRAIN = 256
MODEL = {"d_model": 256, "n_layers": 4, "n_heads": 8, "hidden": 1024, "vocab": 384}


def vm_hwm_mib(pid: int | str = "self") -> float:
    """Peak resident set size of process ``pid`` (this one by default) since its last reset (MiB)."""
    return int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def reset_hwm() -> None:
    """Reset this process's peak resident set size to its current size."""
    Path("/proc/self/clear_refs").write_text("5")


def build(ac: str | None, world: int):
    """The model (Ulysses-wrapped and context-parallel over all ranks when ``world > 1``) and
    its optimizer."""
    import torch
    from olmo_core.nn.attention.ring import UlyssesContextParallelStyle
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerConfig
    from torch.distributed.device_mesh import init_device_mesh

    from olmx.worker.train import activation_checkpointing_config
    from olmx_plugins.parallel.ulysses_attention import apply_ulysses_attention

    config = TransformerConfig.llama_like(
        d_model=MODEL["d_model"],
        vocab_size=MODEL["vocab"],
        n_layers=MODEL["n_layers"],
        n_heads=MODEL["n_heads"],
        feed_forward=FeedForwardConfig(hidden_size=MODEL["hidden"], bias=False),
    )
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    if world > 1:
        apply_ulysses_attention(model)
        model.apply_cp(
            init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))["cp"], uly=UlyssesContextParallelStyle()
        )
    if ac:
        cfg = activation_checkpointing_config(ac)
        model.apply_activation_checkpointing(cfg.mode, modules=cfg.modules)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optim, seq_len: int) -> tuple[float, float]:
    """One training step on one sequence of ``seq_len`` tokens; returns (wall, CPU) seconds."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seq_len)
    ids = torch.randint(0, 256, (1, seq_len), generator=g)
    labels = F.pad(ids[:, 1:], (0, 1), value=-100)
    t0, c0 = time.perf_counter(), time.process_time()
    out = model(ids, labels=labels, loss_reduction="sum", loss_div_factor=seq_len - 1)
    out.loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, time.process_time() - c0


def group_reduce(local: float, op: str = "max") -> float:
    """Maximum (or sum) of ``local`` over all ranks."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return local
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(t.item())


def measure(model, optim, seq_len: int) -> tuple[float, float, float]:
    """(group peak MiB, wall seconds of the slowest rank, CPU seconds of all ranks) of one step."""
    reset_hwm()
    wall, cpu = step(model, optim, seq_len)
    return group_reduce(vm_hwm_mib()), group_reduce(wall), group_reduce(cpu, "sum")


def search(model, optim, cap: float, world: int) -> tuple[int, float, list[tuple[int, float]]]:
    """Longest S (multiple of GRAIN) whose step peak fits ``cap``; every trial recorded."""
    trials: list[tuple[int, float]] = []

    def fits(s: int) -> bool:
        peak = measure(model, optim, s)[0]
        trials.append((s, peak))
        return peak <= cap

    lo, hi = 0, 512
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > GRAIN:
        mid = (lo + hi) // 2 // GRAIN * GRAIN
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, dict(trials).get(lo, 0.0), trials


def fitted_max(trials: list[tuple[int, float]], cap: float) -> int:
    """Longest S under ``cap`` from a least-squares line through the trials' (S, peak MiB):
    a finer answer than the search's 256-token grid (peak memory is linear in S here: the CPU
    SDPA kernel keeps no S x S matrix)."""
    n = len(trials)
    mean_s = sum(t[0] for t in trials) / n
    mean_m = sum(t[1] for t in trials) / n
    slope = sum((t[0] - mean_s) * (t[1] - mean_m) for t in trials) / sum((t[0] - mean_s) ** 2 for t in trials)
    return int((cap - (mean_m - slope * mean_s)) / slope)


def worker(rank: int, world: int, task: dict, port: int, queue) -> None:
    """One process of a configuration; rank 0 puts the result on ``queue``."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.distributed.nn deprecation
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model, optim = build(task.get("ac"), world)
    result: dict = {}
    try:
        step(model, optim, 256)  # warm-up: allocator, optimizer state
        reset_hwm()
        result["base_mib"] = group_reduce(vm_hwm_mib())
        if task["kind"] == "maxlen":
            result["max_seq"], result["peak_mib"], result["trials"] = search(model, optim, task["cap"], world)
        else:
            runs = [measure(model, optim, task["seq"]) for _ in range(task.get("repeat", 3))]
            result["peak_mib"] = max(r[0] for r in runs)
            result["seconds"] = statistics.median(r[1] for r in runs)
            result["cpu_seconds"] = statistics.median(r[2] for r in runs)
    except RuntimeError as exc:  # reported in the table (one process only: no peer is left waiting)
        if world > 1:
            raise
        result["error"] = str(exc).splitlines()[0]
    if rank == 0:
        queue.put(result)
    if world > 1:
        dist.destroy_process_group()


def run(task: dict, world: int) -> dict:
    """Run one configuration in ``world`` fresh processes."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world, task, port, queue), nprocs=world, start_method="spawn")
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mib", type=float, default=1024.0, help="per-process peak RSS cap")
    parser.add_argument("--equal-tokens", type=int, default=4096, help="total tokens per step for the step-time table")
    parser.add_argument("--ac-tokens", type=int, default=4096, help="sequence length of the checkpointing table")
    parser.add_argument("--skip-maxlen", action="store_true")
    args = parser.parse_args()
    import torch

    print(
        f"# Ulysses benchmark ({datetime.now():%Y-%m-%d %H:%M}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})"
    )
    print(f"model {MODEL}, fp32, 1 thread per process\n")

    if not args.skip_maxlen:
        print(f"## Longest sequence under a {args.cap_mib:.0f} MiB per-process peak RSS cap\n")
        print(
            "| processes | activation checkpointing | baseline MiB | longest sequence (256 grid) | its peak MiB "
            "| fitted longest | fitted vs 1 process, no checkpointing |"
        )
        print("|---|---|---|---|---|---|---|")
        reference = None
        for ac in (None, "long_context"):
            for world in (1, 2):
                r = run({"kind": "maxlen", "cap": args.cap_mib, "ac": ac}, world)
                fit = fitted_max(r["trials"], args.cap_mib)
                reference = reference or fit
                print(
                    f"| {world}{' (Ulysses)' if world > 1 else ''} | {ac or 'none'} | {r['base_mib']:.0f} | "
                    f"{r['max_seq']:,} | {r['peak_mib']:.0f} | {fit:,} | {fit / reference:.2f}x |",
                    flush=True,
                )
                print(f"<!-- trials (S, peak MiB): {r['trials']} -->", file=sys.stderr, flush=True)
        print()

    n = args.equal_tokens
    print(f"## Step time at equal total tokens ({n:,} tokens per step, median of 3)\n")
    print(
        "| processes | tokens per process | step wall seconds (slowest rank) | step CPU seconds (all ranks) "
        "| peak MiB per process |"
    )
    print("|---|---|---|---|---|")
    for world in (1, 2):
        r = run({"kind": "time", "seq": n}, world)
        print(
            f"| {world}{' (Ulysses)' if world > 1 else ''} | {n // world:,} | {r['seconds']:.2f} | "
            f"{r['cpu_seconds']:.2f} | {r['peak_mib']:.0f} |",
            flush=True,
        )
    print()

    s = args.ac_tokens
    print(f"## Activation checkpointing, 1 process, {s:,}-token sequence (median of 3)\n")
    print("| trainer.activation_checkpointing | peak MiB | above baseline MiB | step wall seconds | step CPU seconds |")
    print("|---|---|---|---|---|")
    # selected_ops is OLMo-core's op-level policy, measured for comparison (olmx does not offer it)
    for ac in (None, "long_context", "full", "selected_ops"):
        r = run({"kind": "time", "seq": s, "ac": ac}, 1)
        if "error" in r:
            print(f"| {ac} | fails: {r['error'][:120]} | | | |", flush=True)
            continue
        print(
            f"| {ac or 'null'} | {r['peak_mib']:.0f} | {r['peak_mib'] - r['base_mib']:.0f} | "
            f"{r['seconds']:.2f} | {r['cpu_seconds']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
