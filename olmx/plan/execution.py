"""How the worker executes the run, decided at plan time for the target's device (the plan's
``execution``): the attention kernel rule, ``torch.compile`` and the metrics cadence.

The plan is made where the run is described (a laptop, a login node), not where it runs, so
the attention backend is a rule the worker applies with what is installed there
(:func:`olmx.worker.model.attention_backend`); what can be known here is checked here: a
flash-attention kernel with float32 compute, a CUDA-only kernel on a CPU run, flash-attn 3
below SM90.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.api import Dtypes, World
from olmx.errors import ConfigError

ATTN_BACKENDS = ("auto", "torch", "flash_2", "flash_3", "te")
COMPILE_MODES = ("auto", "true", "false")
#: Metric records per step on CUDA when ``trainer.log_interval`` is null (OLMo-core's scripts
#: collect every 10-50 steps: collecting syncs the host with the device).
CUDA_LOG_INTERVAL = 10


@dataclass(frozen=True)
class Execution:
    """What the plan decided about executing the run."""

    #: ``model.attn_backend`` as the worker applies it (``auto`` stays a rule, see
    #: :func:`olmx.worker.model.attention_backend`).
    attention: str = "torch"
    #: ``torch.compile`` the model's blocks.
    compile: bool = False
    #: Steps between metric collections (and ``metrics.jsonl`` records).
    log_interval: int = 1
    #: Plan rows: the rule, and why.
    notes: tuple[str, ...] = ()


def resolve_execution(run: Any, world: World, dtypes: Dtypes) -> Execution:
    """The execution decisions for ``run`` on ``world`` with the precision plugin's dtypes."""
    m, t = run.model, run.trainer
    half = dtypes.param != "float32"
    backend = m.attn_backend
    if backend not in ATTN_BACKENDS:
        raise ConfigError("model.attn_backend", f"'{backend}' is not one of {', '.join(ATTN_BACKENDS)}")
    if backend in ("flash_2", "flash_3", "te") and world.device != "cuda":
        raise ConfigError(
            "model.attn_backend",
            f"{backend} needs CUDA GPUs; this run's device is {world.device_name} "
            f"({world.device}): use model.attn_backend=auto or torch",
        )
    if backend in ("flash_2", "flash_3") and not half:
        raise ConfigError(
            "model.attn_backend",
            f"{backend} (flash-attention) takes only bfloat16/float16 inputs and "
            f"this run computes in {dtypes.param}: use a 16-bit precision (precision=auto or bf16 on "
            f"CUDA) or model.attn_backend=auto or torch",
        )
    cc = world.compute_capability
    if backend == "flash_3" and cc is not None and cc < (9, 0):
        raise ConfigError(
            "model.attn_backend",
            f"flash_3 (flash-attention 3) needs compute capability 9.0+ (Hopper); "
            f"{world.device_name} has {cc[0]}.{cc[1]}: use flash_2 or auto",
        )
    notes = []
    if backend == "auto":
        rule = (
            "flash_3 where installed on SM90+, else flash_2 where installed, else torch SDPA (16-bit compute on CUDA)"
            if world.device == "cuda" and half
            else f"torch SDPA ({dtypes.param} compute on {world.device})"
        )
        notes.append(f"attention: auto = {rule}")
    if m.sliding_window and backend in ("auto", "torch") and not (world.device == "cuda" and half):
        notes.append(
            "attention: sliding windows on torch SDPA build an explicit seq_len x seq_len mask (no flash "
            "kernel): slow and memory-hungry at long context; flash-attn handles them natively"
        )
    mode = str(t.compile).lower()
    if mode not in COMPILE_MODES:
        raise ConfigError("trainer.compile", f"'{t.compile}' is not one of {', '.join(COMPILE_MODES)}")
    if mode == "true" and world.device != "cuda":
        raise ConfigError(
            "trainer.compile",
            f"true needs CUDA GPUs: OLMo-core 3.0.0 applies torch.compile only where CUDA is available "
            f"(this run's device is {world.device_name}); use trainer.compile=auto or false",
        )
    compile_ = world.device == "cuda" if mode == "auto" else mode == "true"
    notes.append(
        f"torch.compile: {'on' if compile_ else 'off'}"
        + (" (auto: on with CUDA)" if mode == "auto" and compile_ else " (auto: off on CPUs)" if mode == "auto" else "")
    )
    if t.log_interval is not None and t.log_interval < 1:
        raise ConfigError("trainer.log_interval", f"must be a positive integer or null, got {t.log_interval}")
    interval = t.log_interval or (CUDA_LOG_INTERVAL if world.device == "cuda" else 1)
    notes.append(
        f"metrics: every {interval} step(s)"
        + ("" if t.log_interval else f" (null: {CUDA_LOG_INTERVAL} on CUDA, 1 on CPUs)")
    )
    return Execution(attention=backend, compile=compile_, log_interval=interval, notes=tuple(notes))
