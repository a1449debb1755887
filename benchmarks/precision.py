"""Step time of fp32, bf16 and emulated MXFP8 training of the tiny model on this CPU.

One process trains the default tiny model (``conf/model/tiny.yaml``: d_model 128, 4 layers,
byte-level vocabulary padded to 384) on random tokens, ``--batch`` sequences of ``--seq-len``
tokens per step (default: one micro-batch of the default run, 8 x 256), with AdamW. The model
is built as ``olmx run`` builds it (``olmx.worker.model.build_model_config``, OLMo-core's
``Transformer``) and each precision is applied as its plugin applies it on one process:

- ``fp32``: nothing;
- ``bf16``: ``torch.autocast("cpu", bfloat16)`` around forward and loss (what OLMo-core's
  ``autocast_precision`` does), float32 parameters and optimizer;
- ``mxfp8-emulated``: ``olmx_plugins.precision.mx.apply_mxfp8(..., emulate=True)`` (torchao's
  emulated MX recipe on 28 linear layers), the rest float32 (the plugin's CPU default).

The modes are measured side by side: each round times ``--steps`` steps of every mode (after
``--warmup`` untimed steps), in an order that rotates from round to round, because the
machine is shared and its load drifts. Reported per mode: median over rounds of the wall time
and of the process CPU time per step, and their ratios to fp32. Training-loop overhead of the
OLMo-core Trainer (callbacks, metrics, data loading) is left out; it adds the same absolute
time to every mode.

These are CPU numbers: they show the cost of bf16 without bf16 units (AVX2 only) and of
emulating MX in software. They say nothing about GPU speed; for SM100 the target is OLMo-core
3's report (see benchmarks/results/precision.md).

    python benchmarks/precision.py [--rounds 5] [--steps 4] [--warmup 2] [--threads 1] [--record FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import nullcontext
from datetime import datetime

MODES = ("fp32", "bf16", "mxfp8-emulated")


def build(mode: str, *, seed: int):
    """Model and optimizer for ``mode``, initialised identically for every mode."""
    import torch

    from olmx.config.schema import ModelConfig
    from olmx.plan.linears import dense_linears
    from olmx.worker.model import build_model_config
    from olmx_plugins.precision.mx import apply_mxfp8
    from olmx_plugins.precision.mxfp8 import MXFP8Config, keep_reason

    model = build_model_config(ModelConfig(), vocab_size=384).build(init_device="meta")
    if mode == "mxfp8-emulated":  # the layers the plan would list (its rule on the dense model)
        convert = [
            x.name
            for x in dense_linears(ModelConfig(), 384)
            if keep_reason(x.name, x.in_features, x.out_features, keep=x.keep) is None
        ]
        apply_mxfp8(model, MXFP8Config(emulate=True), convert=convert, emulate=True)
    torch.manual_seed(seed)
    model.init_weights(device=torch.device("cpu"), max_seq_len=4096)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optim, batch, mode: str) -> float:
    """One training step; returns the loss."""
    import torch
    import torch.nn.functional as F

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else nullcontext()
    with ctx:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
    loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per mode and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode before the first round")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--record", help="write the markdown table to this file")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    batch = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    runs = {mode: build(mode, seed=0) for mode in MODES}
    first = {mode: step(*runs[mode], batch, mode) for mode in MODES}
    for mode in MODES:
        for _ in range(args.warmup - 1):
            step(*runs[mode], batch, mode)
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        for mode in order:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step(*runs[mode], batch, mode)
            wall[mode].append((time.perf_counter() - t0) / args.steps)
            cpu[mode].append((time.process_time() - c0) / args.steps)
        loads.append(os.getloadavg()[0])

    med_wall = {m: statistics.median(v) for m, v in wall.items()}
    med_cpu = {m: statistics.median(v) for m, v in cpu.items()}
    tokens = args.batch * args.seq_len
    lines = [
        f"Measured {datetime.now():%Y-%m-%d %H:%M} on this CPU ({os.cpu_count()} cores, torch "
        f"{torch.__version__}, {args.threads} thread(s)); tiny model, {args.batch} x {args.seq_len} = {tokens:,} "
        f"tokens per step; {args.rounds} interleaved rounds of {args.steps} steps per mode; 1-min load average "
        f"{min(loads):.1f}-{max(loads):.1f}.",
        "",
        "| mode | wall ms/step (median) | ratio to fp32 | CPU ms/step (median) | ratio to fp32 | first loss |",
        "|---|---|---|---|---|---|",
    ]
    for m in MODES:
        lines.append(
            f"| {m} | {med_wall[m] * 1e3:.0f} | {med_wall[m] / med_wall['fp32']:.2f} | "
            f"{med_cpu[m] * 1e3:.0f} | {med_cpu[m] / med_cpu['fp32']:.2f} | {first[m]:.4f} |"
        )
    lines += [
        "",
        "Per-round wall ms/step: " + "; ".join(f"{m}: {', '.join(f'{x * 1e3:.0f}' for x in wall[m])}" for m in MODES),
    ]
    text = "\n".join(lines)
    print(text)
    if args.record:
        with open(args.record, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
