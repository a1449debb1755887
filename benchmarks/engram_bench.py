"""Engram benchmark: hashing time per step, and bytes moved per step by sharded tables.

Run: ``python benchmarks/engram_bench.py`` (with ``olmx_plugins`` importable). Prints two
markdown tables.

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
    hasher = NgramHasher(layer_ids=LAYERS, max_ngram_size=N, n_head_per_ngram=K,
                         vocab_size_per_ngram=[129280 * 5] * 2, pad_id=comp.canonical(257),
                         seed=0, compressed_vocab_size=comp.compressed_vocab_size)
    rows = ["| device | batch x seq | tokens | layers | median wall ms / step | "
            "median process CPU ms / step | M tokens / s (wall) |",
            "|---|---|---|---|---|---|---|"]
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
            rows.append(f"| {device} | {batch} x {seq} | {batch * seq} | {len(LAYERS)} | "
                        f"{ms:.2f} | {cpu_ms:.2f} | {batch * seq / ms / 1e3:.2f} |")
    return rows


def _traffic_worker(results_path: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    comp = TokenizerCompression(byte_level_tokens())
    ids = corpus_ids(world * BATCH * SEQ).view(world, BATCH, SEQ)[rank : rank + 1]
    lines = []
    for size in TABLE_SIZES:
        hasher = NgramHasher(layer_ids=[1], max_ngram_size=N, n_head_per_ngram=K,
                             vocab_size_per_ngram=[size] * (N - 1), pad_id=comp.canonical(257),
                             seed=0, compressed_vocab_size=comp.compressed_vocab_size)
        hash_ids = hasher.hash(comp.compress(ids.view(BATCH, SEQ)), 1)
        table_bytes = sum(hasher.table_sizes(1)) * DIM * 4
        for label, sharding, degree in (("1d", "1d", None), ("2d 1x2", "2d", 2),
                                        ("2d 2x1", "2d", 1)):
            table = EngramTable(table_sizes=hasher.table_sizes(1), dim=DIM, sharding=sharding,
                                shard_degree=degree)
            table(hash_ids).sum().backward()
            stats = torch.tensor([table.comm.forward_bytes, table.comm.backward_bytes,
                                  table.comm.lookups, table.comm.unique_rows], dtype=torch.long)
            dist.all_reduce(stats)
            fwd, bwd, lookups, unique = (int(v) for v in stats)
            ddp = 2 * (world - 1) * table_bytes  # ring all-reduce, summed over ranks
            lines.append(f"| {size:,} | {table_bytes / 2**20:,.1f} | {label} | {lookups:,} | "
                         f"{unique:,} | {fwd / 2**20:.3f} | {bwd / 2**20:.3f} | "
                         f"{(fwd + bwd) / 2**20:.3f} | {ddp / 2**20:,.1f} |")
            del table
    if rank == 0:
        pathlib.Path(results_path).write_text("\n".join(lines))


def bench_traffic() -> list[str]:
    import tempfile

    from olmo_core.testing import run_distributed_test

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/traffic.txt"
        run_distributed_test(_traffic_worker, world_size=2, backend="gloo", start_method="spawn",
                             func_args=(out,))
        lines = pathlib.Path(out).read_text().splitlines()
    header = ["| head table size | table MiB | sharding | lookups (2 ranks) | unique rows | "
              "fwd MiB | bwd MiB | total MiB / step | replicated+DDP MiB / step (formula) |",
              "|---|---|---|---|---|---|---|---|---|"]
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
    # Run everything first: the worker processes print OLMo-core setup lines.
    hashing = bench_hashing()
    traffic = bench_traffic()
    print(f"\n# Engram benchmark (torch {torch.__version__}, python {sys.version.split()[0]})\n")
    print(f"Machine: {machine()}.\n")
    print(f"Config: layers {LAYERS}, N={N}, K={K}, row width {DIM} (fp32), "
          f"micro-batch {BATCH} x {SEQ} per rank for the traffic table.\n")
    print("## Hashing (compression + all layers) per step\n")
    print("\n".join(hashing))
    print("\n## Bytes moved per step, one Engram layer, 2 gloo processes\n")
    print("\n".join(traffic))


if __name__ == "__main__":
    main()
