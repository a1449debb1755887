"""The torch-free rules of the low-precision linear-layer plugins (``mxfp8``, ``fp8``): which
linear layers stay in high precision, the dtypes of the rest, their plan (the checks and rows
both make, :meth:`LowPrecisionPlugin.resolve`), how the plan shows them, and MXFP8's settings.
Shared by the plans (:mod:`.mxfp8`, :mod:`.fp8`) and the conversions of the built model
(:mod:`.mx`, :mod:`.float8`), so that what the plan lists is what the worker converts."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from olmx.api import Context, Contribution, Dtypes, LinearLayer, Mesh, PrecisionPlugin, World, setting
from olmx.errors import ConfigError

#: Elements sharing one E8M0 scale (OCP MX v1.0).
BLOCK_SIZE = 32
#: Compute capability from which MX block-scaled FP8 tensor cores exist (Blackwell: B200, GB200, B300).
MIN_COMPUTE_CAPABILITY = (10, 0)


class ScaleMode(StrEnum):
    """Values of ``scale_calculation_mode`` (torchao's ``ScaleCalculationMode``)."""

    rceil = "rceil"
    floor = "floor"


@dataclass(frozen=True)
class LowPrecisionConfig:
    """Settings every low-precision linear-layer plugin has (``mxfp8``, ``fp8``)."""

    #: Run torchao's emulation (the same quantization, high-precision matmuls) instead of the
    #: GPU kernels: the same numerics on any device, this CPU included, but slow. For checking
    #: numerics, not for speed.
    emulate: bool = False
    #: dtype of everything that is not a converted linear layer, as ``precision.param_dtype``
    #: (FSDP all-gather dtype, else autocast). null: bfloat16, except float32 on CPU where
    #: parameters are not sharded (torchao 0.15's layers follow CUDA autocast only).
    param_dtype: str | None = None
    #: dtype of the gradient reduction, as ``precision.reduce_dtype``.
    reduce_dtype: str = "float32"
    #: More module-name patterns (fnmatch on names such as ``blocks.0.attention.w_q``) to keep
    #: in high precision, besides the layers the model and layer plugins mark (the output
    #: head, Engram's projections).
    exclude: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MXFP8Config(LowPrecisionConfig):
    """Settings of ``mxfp8`` (emulated: about 2.6x fp32 on a CPU, far slower than bf16 on a GPU)."""

    #: How each block's E8M0 scale is chosen: ``rceil`` (2^ceil(log2(amax/448)), no element
    #: saturates; NVIDIA cuBLAS, OLMo-core's standard recipe) or ``floor`` (OCP's basic rule;
    #: saturates the largest elements of a block).
    scale_calculation_mode: ScaleMode = setting(ScaleMode.rceil)


def keep_reason(
    name: str,
    in_features: int,
    out_features: int,
    *,
    exclude: list[str] | tuple[str, ...] = (),
    keep: str | None = None,
    subclass: bool = False,
    multiple: int = BLOCK_SIZE,
    unit: str = "the MX block size",
    section: str = "precision",
) -> str | None:
    """Why the linear layer ``name`` stays in high precision, or None if it is converted: the
    user's ``exclude`` patterns, the reason its owner gave (``keep``, :class:`LinearLayer`), an
    ``nn.Linear`` subclass, dimensions not multiples of ``multiple``. The one rule; the plan
    applies it to the torch-free layer list and the worker converts what the plan lists."""
    for pattern in exclude:
        if fnmatch.fnmatchcase(name, pattern):
            return f"{section}.exclude matches '{pattern}'"
    if keep is not None:
        return keep
    if subclass:
        return "nn.Linear subclass: torchao converts by replacing the class, dropping its own methods"
    bad = [f"{key}={n}" for key, n in (("in_features", in_features), ("out_features", out_features)) if n % multiple]
    if bad:
        return f"{', '.join(bad)} not a multiple of {unit} {multiple}"
    return None


def missing_torchao() -> str | None:
    """Why the low-precision plugins cannot run here (torchao not installed), or None."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "needs torchao, which is not installed: pip install 'olmx[mxfp8]' (torchao==0.15.0)"
    return None


def hardware(world: World) -> str:
    """The device as the plans and the refusals name it."""
    if world.device == "cpu":
        return "CPU only (no CUDA GPU)"
    cc = world.compute_capability
    return f"{world.device_name} (compute capability {'.'.join(map(str, cc)) if cc else 'unknown'})"


def shown(layers: list[LinearLayer]) -> str:
    """Layer names, those repeated over blocks folded into ``blocks.*.name (xN)``."""
    groups: dict[str, list[str]] = {}
    for layer in layers:
        parts = layer.name.split(".")
        key = ".".join(["blocks", "*", *parts[2:]]) if parts[0] == "blocks" and len(parts) > 2 else layer.name
        groups.setdefault(key, []).append(layer.name)
    return ", ".join(f"{key} (x{len(names)})" if len(names) > 1 else names[0] for key, names in groups.items())


@dataclass(frozen=True)
class ConversionDecisions:
    """What the plan decided a low-precision plugin converts (the worker converts exactly these)."""

    #: Fully qualified names of the ``nn.Linear`` layers to convert, sorted.
    convert: list[str] = field(default_factory=list)


class LowPrecisionPlugin(PrecisionPlugin):
    """What the low-precision linear-layer plugins (``mxfp8``, ``fp8``) share: the dtypes of
    everything they do not convert, their plan (:meth:`resolve`) and their decisions. A subclass
    names its format (:attr:`label`), its alignment (:attr:`multiple`, :attr:`unit`) and fills
    the hooks below :meth:`resolve`."""

    Decisions = ConversionDecisions
    #: The format as the plan names it: ``"{label} linear layers"``, ``compute outside {label} layers``.
    label: str = ""
    #: Every dimension of a converted layer, and the tokens of a micro-batch, must be a multiple of this.
    multiple: int = BLOCK_SIZE
    #: What :attr:`multiple` is, in the reason a layer is kept (``the MX block size``).
    unit: str = "the MX block size"

    def resolve(self, cfg: Any, ctx: Context) -> Contribution:
        """Check torchao, the hardware (unless ``emulate``), the tokens of a micro-batch and the
        model (:meth:`check_model`); list the converted and the kept linear layers; state what
        runs in which dtype. The layers' names are the decision the worker converts."""
        if missing := missing_torchao():
            raise ConfigError(self.section, missing)
        world = ctx.world
        cc = world.compute_capability
        need = self.min_capability(cfg)
        native = world.device == "cuda" and (cc is None or cc >= need)
        if not native and not cfg.emulate:
            raise ConfigError(self.section, self.hardware_refusal(cfg, world, need))
        tokens, how = ctx.tokens_per_rank()
        if tokens % self.multiple:
            raise ConfigError("trainer.micro_batch_size", self.tokens_refusal(tokens, how))
        self.check_model(cfg, ctx)
        converted, kept = split_planned(
            ctx, exclude=cfg.exclude, multiple=self.multiple, unit=self.unit, section=self.section
        )
        rows = [
            self.format_row(cfg),
            ("hardware", hardware(world) + ("" if cc or world.device != "cuda" else ", checked on the worker")),
            ("kernels", self.kernels(cfg)),
            (f"{self.label} linear layers", f"{len(converted)}: {shown(converted)}"),
            *((f"kept in {ctx.dtypes.param}", f"{shown(v)}: {k}") for k, v in kept.items()),
            *ctx.dtype_rows(compute_label=f"compute outside {self.label} layers"),
            ("tokens per micro-batch", f"{tokens} ({how}), a multiple of {self.multiple}"),
            *self.notes(cfg, ctx),
        ]
        if cfg.emulate:
            rows.append(("warning", f"emulated {self.label} is slow: use it to check numerics, not to train for speed"))
        return Contribution(rows=rows, decisions=ConversionDecisions(convert=sorted(layer.name for layer in converted)))

    def min_capability(self, cfg: Any) -> tuple[int, int]:
        """The compute capability the format's GPU kernels need."""
        raise NotImplementedError

    def hardware_refusal(self, cfg: Any, world: World, need: tuple[int, int]) -> str:
        """Why ``world`` cannot run the kernels (compute capability ``need``) and what to do."""
        raise NotImplementedError

    def tokens_refusal(self, tokens: int, how: str) -> str:
        """Why ``tokens`` per micro-batch (``how``: the product that makes them) must be a
        multiple of :attr:`multiple`."""
        raise NotImplementedError

    def check_model(self, cfg: Any, ctx: Context) -> None:
        """The format's checks of the model beyond its linear layers (none by default)."""

    def format_row(self, cfg: Any) -> tuple[str, str]:
        """The plan's first row: the format or recipe in words."""
        raise NotImplementedError

    def kernels(self, cfg: Any) -> str:
        """The plan's ``kernels`` row: what computes the converted layers."""
        raise NotImplementedError

    def notes(self, cfg: Any, ctx: Context) -> list[tuple[str, str]]:
        """More rows after the tokens per micro-batch (none by default)."""
        return []

    def dtypes(self, cfg: LowPrecisionConfig, run: Any, world: World, mesh: Mesh) -> Dtypes:
        """``param_dtype``, whose null default is bfloat16, except float32 on CPU where
        parameters are not sharded (there bfloat16 would mean CPU autocast, which torchao 0.15's
        MXLinear and Float8Linear ignore: they follow CUDA autocast only)."""
        section = self.section
        param = cfg.param_dtype or ("float32" if world.device == "cpu" and not mesh.shards_params else "bfloat16")
        if world.device == "cpu" and param == "bfloat16" and not mesh.shards_params:
            raise ConfigError(
                f"{section}.param_dtype",
                "bfloat16 without a data-parallel strategy that shards parameters (parallel=[fsdp] or [hsdp]) means "
                "CPU autocast, which torchao 0.15's low-precision linear layers ignore (they follow CUDA autocast "
                f"only), so bfloat16 activations would meet float32 weights; set {section}.param_dtype=float32 or "
                "use fsdp",
            )
        return Dtypes(param=param, reduce=cfg.reduce_dtype)


def split_planned(
    ctx: Context, *, exclude: list[str], multiple: int, unit: str, section: str
) -> tuple[list[LinearLayer], dict[str, list[LinearLayer]]]:
    """The model's linear layers (as the plan sees them) that are converted, and the kept ones
    by reason; ConfigError when none would be converted."""
    converted: list[LinearLayer] = []
    kept: dict[str, list[LinearLayer]] = {}
    for layer in ctx.linear_layers():
        why = keep_reason(
            layer.name,
            layer.in_features,
            layer.out_features,
            exclude=exclude,
            keep=layer.keep,
            subclass=layer.subclass,
            multiple=multiple,
            unit=unit,
            section=section,
        )
        if why is None:
            converted.append(layer)
        else:
            kept.setdefault(why, []).append(layer)
    if not converted:
        raise ConfigError(
            section,
            "no linear layer of the model would be converted: "
            + "; ".join(f"{shown(v)}: {k}" for k, v in kept.items()),
        )
    return converted, kept
