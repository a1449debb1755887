"""How the worker executes the run, decided at plan time for the target's device (the plan's
``execution``): the attention kernel rule, ``torch.compile``, the metrics cadence and the hang
watchdog's timeout.

The plan is made where the run is described (a laptop, a login node), not where it runs, so
the attention backend is a rule the worker applies with what is installed there
(:func:`olmx.worker.model.attention_backend`); what can be known here is checked here: a
flash-attention kernel with float32 compute, a CUDA-only kernel on a CPU run, flash-attn 3
off Hopper (SM 9.x).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmx.errors import ConfigError
from olmx.types import Dtypes, World

COMPILE_MODES = ("auto", "true", "false")
#: Metric records per step on CUDA when ``trainer.log_interval`` is null (OLMo-core's scripts
#: collect every 10-50 steps: collecting syncs the host with the device).
CUDA_LOG_INTERVAL = 10
#: ``trainer.hang_timeout`` when null, seconds: 10 minutes on CUDA (NCCL's own default
#: collective timeout; a step, evaluation or save of a healthy run ends well within it), 30
#: minutes on CPUs (gloo's default; CPU steps of real models take minutes).
HANG_TIMEOUT = {"cuda": 600, "cpu": 1800}


def windows_matter(windows: list[int] | tuple[int, ...] | None, seq_len: int | None) -> bool:
    """Whether sliding windows change anything for sequences of at most ``seq_len`` tokens:
    a window of ``w`` lets token ``i`` see tokens ``i - w + 1 .. i`` (OLMo-core's
    ``window_size = (w - 1, 0)``), so where every window is at least ``seq_len`` each token
    already sees all earlier ones and the attention is plain causal attention."""
    if not windows:
        return False
    return seq_len is None or any(w != -1 and w < seq_len for w in windows)


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
    #: Seconds without progress before the hang watchdog ends the run (0: off).
    hang_timeout: int = 0
    #: Plan rows: the rule, and why.
    notes: tuple[str, ...] = ()


def compiles(trainer: Any, world: World) -> bool:
    """Whether ``trainer.compile`` compiles the blocks on ``world`` (``auto``: on with CUDA);
    an invalid mode is :func:`resolve_execution`'s to refuse."""
    mode = str(trainer.compile).lower()
    return world.device == "cuda" if mode == "auto" else mode == "true" and world.device == "cuda"


def resolve_execution(run: Any, world: World, dtypes: Dtypes) -> Execution:
    """The execution decisions for ``run`` on ``world`` with the precision plugin's dtypes."""
    m, t = run.model, run.trainer
    half = dtypes.param != "float32"
    backend = m.attn_backend
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
    if backend == "flash_3" and cc is not None and not (9, 0) <= cc < (10, 0):
        raise ConfigError(
            "model.attn_backend",
            f"flash_3 (flash-attention 3) runs in OLMo-core only on compute capability 9.x (Hopper); "
            f"{world.device_name} has {cc[0]}.{cc[1]}: use flash_2 or auto",
        )
    notes = []
    if backend == "auto":
        rule = (
            "flash_3 where it imports on SM 9.x (Hopper), else flash_2 where it imports, else torch SDPA "
            "(16-bit compute on CUDA)"
            if world.device == "cuda" and half
            else f"torch SDPA ({dtypes.param} compute on {world.device})"
        )
        notes.append(f"attention: auto = {rule}")
    if m.sliding_window and not windows_matter(m.sliding_window, run.data.seq_len):
        sizes = ", ".join(sorted({str(w) for w in m.sliding_window if w != -1}))
        notes.append(
            f"attention: the sliding windows ({sizes} tokens) cover data.seq_len={run.data.seq_len}, so they "
            "change nothing and are left out in training: plain causal attention, SDPA's flash kernel "
            "(export keeps them: the architecture)"
        )
    elif m.sliding_window and backend in ("auto", "torch") and not (world.device == "cuda" and half):
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
    compile_ = compiles(t, world)
    if t.activation_checkpointing == "budget" and not compile_:
        raise ConfigError(
            "trainer.activation_checkpointing",
            "budget needs torch.compile: its memory budget is applied by torch.compile's partitioner "
            f"(trainer.compile={t.compile} on {world.device_name} does not compile; OLMo-core compiles only "
            "where CUDA is available): use long_context, full or auto",
        )
    notes.append(
        f"torch.compile: {'on' if compile_ else 'off'}"
        + (" (auto: on with CUDA)" if mode == "auto" and compile_ else " (auto: off on CPUs)" if mode == "auto" else "")
    )
    notes += profile_notes(t, world)
    interval = t.log_interval or (CUDA_LOG_INTERVAL if world.device == "cuda" else 1)
    notes.append(
        f"metrics: every {interval} step(s)"
        + ("" if t.log_interval else f" (null: {CUDA_LOG_INTERVAL} on CUDA, 1 on CPUs)")
    )
    hang = HANG_TIMEOUT.get(world.device, HANG_TIMEOUT["cpu"]) if t.hang_timeout is None else t.hang_timeout
    notes.append(
        f"hang watchdog: {f'{hang} s without progress on any rank' if hang else 'off'}"
        + (f" (null: {HANG_TIMEOUT['cuda']} on CUDA, {HANG_TIMEOUT['cpu']} on CPUs)" if t.hang_timeout is None else "")
    )
    return Execution(attention=backend, compile=compile_, log_interval=interval, hang_timeout=hang, notes=tuple(notes))


def profile_notes(t: Any, world: World) -> list[str]:
    """The plan's lines on ``trainer.profile`` / ``trainer.memory_snapshot``, or why they cannot run."""
    if t.memory_snapshot and not t.profile:
        raise ConfigError("trainer.memory_snapshot", "records over the profiled steps: set trainer.profile=true too")
    if not t.profile:
        return []
    last = t.profile_start + t.profile_steps - 1
    end = t.stop_at_step or t.max_steps
    if last > end:
        raise ConfigError(
            "trainer.profile_start",
            f"profiles steps {t.profile_start}-{last}, past the run's last step {end}: start earlier or profile fewer",
        )
    if t.memory_snapshot and world.device != "cuda":
        raise ConfigError(
            "trainer.memory_snapshot",
            f"records CUDA allocations; this run's device is {world.device_name} ({world.device})",
        )
    what = "CPU and CUDA activity" if world.device == "cuda" else "CPU activity"
    snapshot = " and a CUDA memory snapshot" if t.memory_snapshot else ""
    return [
        f"profile: rank 0, steps {t.profile_start}-{last} ({what}, Python stacks; step {t.profile_start - 1} "
        f"warms up): a Chrome trace{snapshot} in RUN_DIR/profile/; those steps run slower"
    ]


#: The modules flash-attention installs (2: ``flash_attn``; 3: ``flash_attn_3`` or, built from
#: source, ``flash_attn_interface``), as OLMo-core imports them.
FLASH_MODULES = ("flash_attn", "flash_attn_3", "flash_attn_interface")


def kernel_warnings(execution: Execution, world: World, dtypes: Dtypes) -> list[str]:
    """The plan's warning where ``model.attn_backend=auto`` on CUDA will find no flash kernel:
    no flash-attention package is installed in the environment that makes the plan (looked up,
    not imported: the plan imports no torch). Local runs train in this environment; Slurm and
    RunPod nodes may have their own, hence "where this plan was made"."""
    import importlib.util

    if execution.attention != "auto" or world.device != "cuda" or dtypes.param == "float32":
        return []
    if any(importlib.util.find_spec(name) is not None for name in FLASH_MODULES):
        return []
    return [
        "no flash-attention package is installed where this plan was made (flash_attn, flash_attn_3): "
        "model.attn_backend=auto falls back to torch SDPA, whose flash kernel serves plain causal attention "
        "but not sliding windows shorter than data.seq_len (an explicit mask: S^2 work and memory); "
        "install a flash-attn build that matches this torch for flash_2/flash_3"
    ]
