"""olmx models as Hugging Face ``transformers`` checkpoints, without torch.

Which ``transformers`` architecture an olmx model is (OLMo-core 3.0.0's conversion,
``olmo_core.nn.hf``, maps its state both ways):

* ``model.block=default`` (pre-norm), no QK-norm, no sliding window: **Llama**
  (``LlamaForCausalLM``; OLMo-core has the Llama key mapping, olmx writes the ``LlamaConfig``);
* ``model.block=reordered_norm`` (OLMo 2/3 post-norm) with ``model.qk_norm=true``: **OLMo 2**
  (``Olmo2ForCausalLM``), or **OLMo 3** (``Olmo3ForCausalLM``) when some layers use a sliding
  window (all of them the same size); OLMo-core's ``get_hf_config`` chooses between the two.

Nothing else dense is one: QK-norm over all heads before pre-norm blocks (Qwen 3 normalises per
head), sliding windows with pre-norm blocks, post-norm blocks without QK-norm. A model with a
layer plugin's blocks is what that plugin names (the MoE layer: OLMoE or FlexOlmo; Engram: none,
and olmx writes no remote code; ``olmx export torch`` writes any model). :func:`hf_export_class`
is the one answer, which the export refuses with and the plan's ``export hf`` row says.

:func:`hf_tensors` lists the tensors such a checkpoint holds for a model (a test checks it
against OLMo-core's conversion of the built model); :func:`check_init_from` is the plan's check
of ``model.init_from``: the directory's ``config.json`` and the JSON headers of its safetensors
files (8 bytes of little-endian header length, then the header: ``{name: {dtype, shape,
data_offsets}}``), read without torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmx.config.schema import ModelConfig, RunConfig
from olmx.errors import ConfigError

if TYPE_CHECKING:
    from olmx.registry import Registry

LLAMA, OLMO2, OLMO3 = "llama", "olmo2", "olmo3"
#: ``transformers`` model type -> its causal-LM class and what it is in olmx's settings.
ARCHITECTURES = {
    LLAMA: ("LlamaForCausalLM", "model.block=default model.qk_norm=false model.sliding_window=null"),
    OLMO2: ("Olmo2ForCausalLM", "model.block=reordered_norm model.qk_norm=true model.sliding_window=null"),
    OLMO3: ("Olmo3ForCausalLM", "model.block=reordered_norm model.qk_norm=true model.sliding_window=[W,...,-1]"),
}
#: A safetensors header larger than this is not one (real ones are kilobytes to a few MB).
_MAX_HEADER = 100 << 20
_FIELD = "model.init_from"


def layer_windows(model: ModelConfig) -> list[int]:
    """Each layer's attention window (-1: full), as OLMo-core's ``SlidingWindowAttentionConfig``
    assigns olmx's pattern (cycled from the first layer; the last layer attends fully)."""
    pattern = model.sliding_window
    if not pattern:
        return [-1] * model.n_layers
    return [-1 if i == model.n_layers - 1 else pattern[i % len(pattern)] for i in range(model.n_layers)]


def hf_architecture(run: RunConfig) -> str:
    """The ``transformers`` model type of the run's model (:data:`ARCHITECTURES`); a
    :class:`ConfigError` naming the setting that has none, and why."""
    if run.layers:
        names = ",".join(run.layers)
        raise ConfigError(
            "layers",
            f"layers=[{names}] add blocks that no Hugging Face transformers architecture has, and olmx "
            "writes no remote code for them; olmx export torch writes the full state dict of any model",
        )
    m = run.model
    windows = {w for w in layer_windows(m) if w != -1}
    if m.block == "default":
        if m.qk_norm:
            raise ConfigError(
                "model.qk_norm",
                "true with model.block=default: Llama has no QK-norm, and Qwen 3 normalises each head "
                "apart where olmx (OLMo-core) normalises all heads together, so no transformers "
                "architecture computes this model; model.qk_norm=false makes it Llama, "
                "model.block=reordered_norm OLMo 2",
            )
        if windows:
            raise ConfigError(
                "model.sliding_window",
                f"{m.sliding_window} with model.block=default: Llama has no sliding-window attention; "
                "model.block=reordered_norm model.qk_norm=true makes it OLMo 3",
            )
        return LLAMA
    if not m.qk_norm:
        raise ConfigError(
            "model.qk_norm",
            "false with model.block=reordered_norm: transformers' OLMo 2 and OLMo 3 normalise queries "
            "and keys in every layer, and Llama is pre-norm; model.qk_norm=true makes it OLMo 2 (OLMo 3 "
            "with sliding windows), model.block=default Llama",
        )
    if len(windows) > 1:
        raise ConfigError(
            "model.sliding_window",
            f"{m.sliding_window} uses windows of {sorted(windows)} tokens: OLMo 3 has one window size "
            "for all its sliding-window layers; a pattern of one size (and -1) makes it OLMo 3",
        )
    return OLMO3 if windows else OLMO2


def hf_export_class(run: RunConfig, reg: Registry) -> str:
    """The ``transformers`` class ``olmx export hf`` writes the run's model as: a dense model's
    (:func:`hf_architecture`), or the one layer plugin's that names one
    (:meth:`olmx.api.LayerPlugin.hf_architecture`: the MoE layer's OLMoE or FlexOlmo). A
    :class:`ConfigError` naming the setting that has none, why, and what would (the export
    refuses with it, and the plan says it: :func:`hf_export_row`)."""
    if not run.layers:
        return ARCHITECTURES[hf_architecture(run)][0]
    classes = [reg.get("layer", name).hf_architecture(cfg, run) for name, cfg in run.layers.items()]
    if len(classes) > 1:
        names = ",".join(run.layers)
        raise ConfigError(
            "layers",
            f"layers=[{names}]: a transformers class holds one kind of added block, not {len(classes)} "
            "(olmx export torch writes the full state dict of any model)",
        )
    return classes[0]


def hf_export_row(run: RunConfig, reg: Registry) -> tuple[str, str]:
    """The plan's row saying whether ``olmx export hf`` will write the run's checkpoints, as
    what, or why not and what setting would (:func:`hf_export_class`)."""
    try:
        cls = hf_export_class(run, reg)
    except ConfigError as exc:
        torch = "" if "export torch" in str(exc) else " (olmx export torch writes any model)"
        return ("export hf", f"refused: {exc}{torch}")
    return ("export hf", f"{cls} (olmx export hf RUN_DIR --out DIR)")


def hf_tensors(model: ModelConfig, vocab_size: int, arch: str, *, tied: bool = False) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a ``transformers`` checkpoint of architecture ``arch``
    holds for ``model`` with ``vocab_size`` embeddings (``tied``: no separate output head)."""
    d, h = model.d_model, model.n_heads
    kv, hd, f = model.n_kv_heads or h, model.d_model // model.n_heads, model.hidden_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, d), "model.norm.weight": (d,)}
    if not tied:
        out["lm_head.weight"] = (vocab_size, d)
    norms = ("input_layernorm", "post_attention_layernorm")
    if arch != LLAMA:
        norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    for i in range(model.n_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (h * hd, d),
            p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d),
            p + "self_attn.o_proj.weight": (d, h * hd),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
            **{p + f"{n}.weight": (d,) for n in norms},
        }
        if arch != LLAMA:
            out |= {p + "self_attn.q_norm.weight": (h * hd,), p + "self_attn.k_norm.weight": (kv * hd,)}
    return out


def safetensors_tensors(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor in the directory's safetensors weights
    (``model.safetensors``, or the files ``model.safetensors.index.json`` names), read from their
    JSON headers."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(_FIELD, f"{index} is not a safetensors index ({exc})") from None
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ConfigError(
            _FIELD,
            f"{directory} has no model.safetensors (nor model.safetensors.index.json): olmx reads Hugging Face "
            "weights in safetensors format only (pytorch_model.bin is a pickle, which olmx does not load)",
        )
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in files:
        path = directory / name
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                n = int.from_bytes(fh.read(8), "little")
                if not 2 <= n <= min(_MAX_HEADER, size - 8):
                    raise ValueError(f"a header of {n} bytes in a file of {size}")
                header = json.loads(fh.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            if 8 + n + max(ends, default=0) > size:  # cut short behind an intact header
                raise ValueError(
                    f"it is truncated: its header describes {max(ends, default=0):,} bytes of tensors, "
                    f"the file holds {size - 8 - n:,}"
                )
            for key, value in header.items():
                if key != "__metadata__":
                    out[key] = (str(value["dtype"]), tuple(int(s) for s in value["shape"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(_FIELD, f"{path} is not a safetensors file ({exc})") from None
    return out


def _rope(config: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``(theta, type)`` of every RoPE setting of a config.json (transformers 5's
    ``rope_parameters``, flat or per layer type, or 4.x's ``rope_theta``/``rope_scaling``)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        groups = [v for v in params.values() if isinstance(v, dict)] or [params]
        return [(g.get("rope_theta"), g.get("rope_type", "default")) for g in groups]
    scaling = config.get("rope_scaling") or {}
    return [(config.get("rope_theta"), scaling.get("rope_type", scaling.get("type", "default")))]


def _config_differences(config: dict[str, Any], run: RunConfig, vocab_size: int, arch: str) -> list[str]:
    """``key in config.json vs olmx's setting`` for every architecture number that differs."""
    m = run.model
    kv = config.get("num_key_value_heads") or config.get("num_attention_heads")
    checks: list[tuple[str, Any, Any, str]] = [
        ("hidden_size", config.get("hidden_size"), m.d_model, "model.d_model"),
        ("num_hidden_layers", config.get("num_hidden_layers"), m.n_layers, "model.n_layers"),
        ("num_attention_heads", config.get("num_attention_heads"), m.n_heads, "model.n_heads"),
        ("num_key_value_heads", kv, m.n_kv_heads or m.n_heads, "model.n_kv_heads"),
        ("intermediate_size", config.get("intermediate_size"), m.hidden_size, "model.hidden_size"),
        ("rms_norm_eps", config.get("rms_norm_eps"), m.layer_norm_eps, "model.layer_norm_eps"),
        (
            "vocab_size",
            config.get("vocab_size"),
            vocab_size,
            f"embeddings (data.tokenizer.vocab_size={run.data.tokenizer.vocab_size} padded to a multiple of 128)",
        ),
        ("hidden_act", config.get("hidden_act", "silu"), "silu", "SwiGLU feed-forward"),
        ("attention_bias", bool(config.get("attention_bias")), False, "no attention biases"),
        ("mlp_bias", bool(config.get("mlp_bias")), False, "no feed-forward biases"),
    ]
    if config.get("head_dim") is not None:
        checks.append(("head_dim", config["head_dim"], m.d_model // m.n_heads, "model.d_model / model.n_heads"))
    for theta, kind in _rope(config):
        checks.append(("rope theta", None if theta is None else float(theta), float(m.rope_theta), "model.rope_theta"))
        checks.append(("rope type", kind, "default", "OLMo-core's unscaled RoPE"))
    if arch == OLMO3:
        windows = layer_windows(m)
        types = ["full_attention" if w == -1 else "sliding_attention" for w in windows]
        checks.append(("layer_types", config.get("layer_types"), types, f"model.sliding_window={m.sliding_window}"))
        checks.append(
            ("sliding_window", config.get("sliding_window"), max(windows), f"model.sliding_window={m.sliding_window}")
        )
    out = []
    for key, theirs, ours, setting in checks:
        if theirs != ours:
            out.append(f"{key} {theirs!r} in config.json, {ours!r} in olmx's model ({setting})")
    return list(dict.fromkeys(out))


def check_init_from(run: RunConfig, vocab_size: int, resume_step: int | None) -> list[tuple[str, str]]:
    """The plan's rows for ``model.init_from`` after checking the directory: it exists here,
    its ``config.json`` is the architecture the run's model maps to with the same numbers, and
    its safetensors weights hold exactly the tensors (names and shapes) that architecture has
    for this model. A run that resumes loads its own checkpoint and reads nothing from it."""
    from olmx.api import require_package

    raw = run.model.init_from
    assert raw is not None
    for package in ("transformers", "safetensors"):  # the worker loads it with both
        require_package(package, extra="hf", field=_FIELD)
    directory = Path(os.path.expanduser(raw)).absolute()
    if resume_step is not None:
        return [("init_from", f"{directory}: not loaded, the run resumes from its checkpoint at step {resume_step}")]
    if not directory.is_dir():
        what = "is a file" if directory.exists() else "does not exist"
        raise ConfigError(
            _FIELD,
            f"'{raw}' {what}: init_from takes a local Hugging Face checkpoint directory (config.json plus "
            "safetensors weights); nothing is downloaded, so a Hub model id is not one",
        )
    try:
        arch = hf_architecture(run)
    except ConfigError as exc:
        raise ConfigError(_FIELD, f"olmx's model has no Hugging Face architecture to load from: {exc}") from None
    cls, settings = ARCHITECTURES[arch]
    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        raise ConfigError(_FIELD, f"{directory} has no config.json: not a Hugging Face checkpoint directory") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(_FIELD, f"{directory / 'config.json'} cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(_FIELD, f"{directory / 'config.json'} holds no JSON object")
    if "auto_map" in config:
        raise ConfigError(
            _FIELD,
            f"{directory / 'config.json'} names remote code (auto_map): olmx runs no code from a checkpoint "
            f"directory; it loads {', '.join(ARCHITECTURES)} checkpoints",
        )
    kind = config.get("model_type")
    if kind != arch:
        known = ARCHITECTURES.get(str(kind))
        hint = f"; olmx builds a {kind} model with {known[1]}" if known else ""
        raise ConfigError(
            _FIELD,
            f"{directory} holds a {kind!r} model, and this run's model is {arch} ({cls}){hint}",
        )
    differences = _config_differences(config, run, vocab_size, arch)
    if differences:
        raise ConfigError(_FIELD, f"{directory} is another {arch} model: {'; '.join(differences)}")
    if not ((directory / "generation_config.json").is_file() or (directory / "model.safetensors.index.json").is_file()):
        raise ConfigError(
            _FIELD,
            f"{directory} has no generation_config.json, which OLMo-core's loader (load_hf_model) asks of a "
            "checkpoint directory (transformers' save_pretrained writes it)",
        )
    tied = bool(config.get("tie_word_embeddings", False))
    want = hf_tensors(run.model, vocab_size, arch, tied=tied)
    have = safetensors_tensors(directory)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    differ = [k for k in sorted(want) if k in have and have[k][1] != want[k]]
    shapes = [f"{k} {list(have[k][1])} (olmx's model: {list(want[k])})" for k in differ]
    problems = []
    for label, items in (("missing", missing), ("not in olmx's model", extra), ("other shapes", shapes)):
        if items:
            problems.append(f"{label}: {', '.join(items[:4])}{f' and {len(items) - 4} more' if len(items) > 4 else ''}")
    if problems:
        raise ConfigError(_FIELD, f"{directory}'s tensors do not fit olmx's model: {'; '.join(problems)}")
    params = sum(_numel(shape) for _, shape in have.values())
    dtypes = "/".join(sorted({dtype for dtype, _ in have.values()}))
    head = "; the checkpoint ties the output head to the embeddings, olmx copies it" if tied else ""
    return [
        (
            "init_from",
            f"{directory}: {cls} ({arch}), {len(have)} tensors, {params:,} parameters ({dtypes}), loaded "
            f"into every weight of the model before the first step{head} (a resume loads its checkpoint instead)",
        )
    ]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
