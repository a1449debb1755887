"""Engram benchmark: step time with and without Engram, hashing time, sharded-table traffic.

Run: ``python benchmarks/engram_bench.py`` (with ``olmx_plugins`` importable; ``--rounds`` sets
the timed rounds of part 0). Prints three markdown tables.

0. Step time: 2 gloo processes (1 thread each, as ``olmx run`` gives them on 2 cores) build,
   in the same processes, the default tiny model (``olmx train``), the same backbone with
   Engram (``experiment=engram_tiny``) and that with ``1d``-sharded tables, each exactly as
   ``olmx run`` builds it (plan -> ``build_model`` -> DDP, AdamW with olmx's optimizer groups),
   all from the same seed. Rounds interleave one training step of each (forward + loss +
   backward + optimizer step on one 8 x 256 micro-batch of stdlib bytes per rank, the default
   run's micro-batch; no gradient clipping), rotating the order every round; a step's time is
   the slower rank's. Hashing: the model's own compression + ``NgramHasher.hash_all`` call
   inside each Engram step, timed in place, as a share of that step.
1. Hashing: tokenizer compression + ``NgramHasher.hash_all`` for all Engram layers of one
   micro-batch, on this machine's CPU (and on CUDA when present), median of repeated steps.
   Tokens are real text: UTF-8 bytes of Python standard-library sources, byte-level tokenizer.
2. Traffic: 2 gloo processes, one Engram layer's table sharded ``1d`` and ``2d`` (both 2-rank
   layouts), forward + backward of one micro-batch per rank; bytes sent to other ranks,
   summed over both ranks, from ``EngramTable.comm``. For comparison, the bytes a replicated
   table costs under DDP (ring all-reduce of its dense gradient: ``2 (W-1)/W`` table bytes
   per rank) are computed from the formula, not measured.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

from olmx_plugins.layers.engram.compression import TokenizerCompression, byte_level_tokens
from olmx_plugins.layers.engram.hashing import NgramHasher
from olmx_plugins.layers.engram.sharding import EngramTable

STEP_VARIANTS = {  # label -> olmx overrides; the backbone is the default tiny model in all
    "tiny": [],
    "tiny + Engram": ["experiment=engram_tiny"],
    "tiny + Engram 1d": ["experiment=engram_tiny", "layers.engram.sharding=1d"],
}
LAYERS = [1, 15]
N, K, DIM = 3, 8, 8  # DIM kept small for CPU memory; bytes scale linearly with it
TABLE_SIZES = [10_000, 100_000, 1_000_000]
BATCH, SEQ = 4, 512


def corpus_ids(num_tokens: int) -> torch.Tensor:
    """Byte ids of standard-library sources (the olmx default corpus), ``num_tokens`` long."""
    data = bytearray()
    for path in sorted(pathlib.Path(pathlib.__file__).parent.glob("*.py")):
        data += path.read_bytes()
        if len(data) >= num_tokens:
            break
    return torch.tensor(list(data[:num_tokens]), dtype=torch.long)


def bench_hashing() -> list[str]:
    comp = TokenizerCompression(byte_level_tokens())
    hasher = NgramHasher(
        layer_ids=LAYERS,
        max_ngram_size=N,
        n_head_per_ngram=K,
        vocab_size_per_ngram=[129280 * 5] * 2,
        pad_id=comp.canonical(257),
        seed=0,
        compressed_vocab_size=comp.compressed_vocab_size,
    )
    rows = [
        "| device | batch x seq | tokens | layers | median wall ms / step | "
        "median process CPU ms / step | M tokens / s (wall) |",
        "|---|---|---|---|---|---|---|",
    ]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for batch, seq in ((4, 512), (8, 2048), (4, 8192)):
            ids = corpus_ids(batch * seq).view(batch, seq).to(device)
            wall, cpu = [], []
            for _ in range(11):
                if device == "cuda":
                    torch.cuda.synchronize()
                t0, c0 = time.perf_counter(), time.process_time()
                hasher.hash_all(comp.compress(ids))
                if device == "cuda":
                    torch.cuda.synchronize()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            ms = statistics.median(wall[1:]) * 1e3
            cpu_ms = statistics.median(cpu[1:]) * 1e3
            rows.append(
                f"| {device} | {batch} x {seq} | {batch * seq} | {len(LAYERS)} | "
                f"{ms:.2f} | {cpu_ms:.2f} | {batch * seq / ms / 1e3:.2f} |"
            )
    return rows


class _TimedInputs:
    """Wraps a model's ``engram_inputs`` (compression + hashing) and records its wall time."""

    def __init__(self, inputs):
        self.inputs, self.seconds = inputs, 0.0

    def __call__(self, input_ids: torch.Tensor):
        t0 = time.perf_counter()
        out = self.inputs(input_ids)
        self.seconds += time.perf_counter() - t0
        return out


def _build_variant(overrides: list[str]):
    """Model (DDP over all ranks) and optimizer of an olmx run, built as ``olmx run`` does."""
    from torch.distributed.device_mesh import init_device_mesh

    from olmx.config.compose import compose, to_object
    from olmx.plan.resolve import resolve
    from olmx.registry import registry
    from olmx.worker.model import build_model
    from olmx.worker.train import train_module_config

    reg = registry()
    run = to_object(compose(overrides, reg), reg)
    plan = resolve(run, reg)
    model = build_model(plan, reg)
    torch.manual_seed(run.trainer.seed)
    model.init_weights(device=torch.device("cpu"), max_seq_len=plan.batch.seq_len)
    model.apply_ddp(dp_mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    optim = train_module_config(plan, reg).optim.build(model)
    if hasattr(model, "engram_inputs"):
        model.engram_inputs = _TimedInputs(model.engram_inputs)
    return model, optim, plan.batch.seq_len


def _train_step(model, optim, ids: torch.Tensor) -> tuple[float, float]:
    """One step; (wall seconds of the slower rank, this rank's hashing seconds within it)."""
    import torch.nn.functional as F

    timed = getattr(model, "engram_inputs", None)
    if timed is not None:
        timed.seconds = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    logits = model(ids[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    wall = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    return float(wall), timed.seconds if timed is not None else 0.0


def _step_time_worker(results_path: str, rounds: int, warmup: int):
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    variants = {label: _build_variant(o) for label, o in STEP_VARIANTS.items()}
    seq = next(iter(variants.values()))[2]
    text = corpus_ids(world * rounds * 8 * (seq + 1)).view(rounds, world, 8, seq + 1)
    labels = list(variants)
    times: dict[str, list[float]] = {label: [] for label in labels}
    hashing: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(warmup + rounds):
        ids = text[r % rounds, rank]
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            model, optim, _ = variants[label]
            wall, hash_s = _train_step(model, optim, ids)
            if r >= warmup:
                times[label].append(wall)
                hashing[label].append(hash_s)
    if rank == 0:
        base = statistics.median(times[labels[0]])
        lines = []
        for label in labels:
            step = statistics.median(times[label])
            h = statistics.median(hashing[label])
            lines.append(
                f"| {label} | {len(times[label])} | {step * 1e3:.1f} | "
                f"{statistics.quantiles(times[label], n=4)[0] * 1e3:.1f} - "
                f"{statistics.quantiles(times[label], n=4)[2] * 1e3:.1f} | "
                f"{step / base:.2f} | " + (f"{h * 1e3:.2f} | {h / step:.1%} |" if h else "- | - |")
            )
        pathlib.Path(results_path).write_text("\n".join(lines))


def bench_step_time(rounds: int, warmup: int = 3) -> list[str]:
    import tempfile

    from olmo_core.testing import run_distributed_test

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/steps.txt"
        run_distributed_test(
            _step_time_worker, world_size=2, backend="gloo", start_method="spawn", func_args=(out, rounds, warmup)
        )
        lines = pathlib.Path(out).read_text().splitlines()
    header = [
        "| model | timed steps | median ms / step | interquartile ms | ratio to tiny | "
        "hashing ms / step | hashing share of step |",
        "|---|---|---|---|---|---|---|",
    ]
    return header + lines


def _traffic_worker(results_path: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    comp = TokenizerCompression(byte_level_tokens())
    ids = corpus_ids(world * BATCH * SEQ).view(world, BATCH, SEQ)[rank : rank + 1]
    lines = []
    for size in TABLE_SIZES:
        hasher = NgramHasher(
            layer_ids=[1],
            max_ngram_size=N,
            n_head_per_ngram=K,
            vocab_size_per_ngram=[size] * (N - 1),
            pad_id=comp.canonical(257),
            seed=0,
            compressed_vocab_size=comp.compressed_vocab_size,
        )
        hash_ids = hasher.hash(comp.compress(ids.view(BATCH, SEQ)), 1)
        table_bytes = sum(hasher.table_sizes(1)) * DIM * 4
        for label, sharding, degree in (("1d", "1d", None), ("2d 1x2", "2d", 2), ("2d 2x1", "2d", 1)):
            table = EngramTable(table_sizes=hasher.table_sizes(1), dim=DIM, sharding=sharding, shard_degree=degree)
            table(hash_ids).sum().backward()
            stats = torch.tensor(
                [table.comm.forward_bytes, table.comm.backward_bytes, table.comm.lookups, table.comm.unique_rows],
                dtype=torch.long,
            )
            dist.all_reduce(stats)
            fwd, bwd, lookups, unique = (int(v) for v in stats)
            ddp = 2 * (world - 1) * table_bytes  # ring all-reduce, summed over ranks
            lines.append(
                f"| {size:,} | {table_bytes / 2**20:,.1f} | {label} | {lookups:,} | "
                f"{unique:,} | {fwd / 2**20:.3f} | {bwd / 2**20:.3f} | "
                f"{(fwd + bwd) / 2**20:.3f} | {ddp / 2**20:,.1f} |"
            )
            del table
    if rank == 0:
        pathlib.Path(results_path).write_text("\n".join(lines))


def bench_traffic() -> list[str]:
    import tempfile

    from olmo_core.testing import run_distributed_test

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/traffic.txt"
        run_distributed_test(_traffic_worker, world_size=2, backend="gloo", start_method="spawn", func_args=(out,))
        lines = pathlib.Path(out).read_text().splitlines()
    header = [
        "| head table size | table MiB | sharding | lookups (2 ranks) | unique rows | "
        "fwd MiB | bwd MiB | total MiB / step | replicated+DDP MiB / step (formula) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    return header + lines


def machine() -> str:
    """CPU model, cores and load average, for the report."""
    import os
    import platform

    model = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds of the step-time part")
    args = parser.parse_args()
    # Run everything first: the worker processes print OLMo-core setup lines.
    steps = bench_step_time(args.rounds)
    hashing = bench_hashing()
    traffic = bench_traffic()
    print(f"\n# Engram benchmark (torch {torch.__version__}, python {sys.version.split()[0]})\n")
    print(f"Machine: {machine()}.\n")
    print(
        f"Config: layers {LAYERS}, N={N}, K={K}, row width {DIM} (fp32), "
        f"micro-batch {BATCH} x {SEQ} per rank for the traffic table.\n"
    )
    print("## Step time of the tiny model with and without Engram, 2 gloo processes, interleaved\n")
    print("\n".join(steps))
    print("\n## Hashing (compression + all layers) per step\n")
    print("\n".join(hashing))
    print("\n## Bytes moved per step, one Engram layer, 2 gloo processes\n")
    print("\n".join(traffic))


if __name__ == "__main__":
    main()
