"""OLMo-core models <-> Hugging Face ``transformers`` checkpoints, through OLMo-core 3.0.0's
conversion (``olmo_core.nn.hf``): its key mappings both ways (``convert_state_to_hf``, and
``load_hf_model``, which converts and places the weights on DTensor/FSDP shards), and its
``get_hf_config`` for OLMo 2/3 models; olmx writes the ``LlamaConfig`` of pre-norm models,
which OLMo-core maps but has no config builder for. Which olmx model is which architecture:
:mod:`olmx.plan.hf`.

:func:`hf_config_args` is the one list of the settings every config olmx writes shares, a layer
plugin's (``hf_checkpoint``) included: public, the only name a plugin imports from here.

Nothing here reaches the Hugging Face Hub: every path is a local directory, and
:func:`offline` switches ``huggingface_hub`` to offline mode first. ``transformers`` is
imported only here (the ``olmx[hf]`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from olmx.config.schema import ModelConfig
from olmx.errors import ConfigError
from olmx.plan import Plan
from olmx.plan.hf import ARCHITECTURES, LLAMA, hf_tensors

#: What a plugin may import from here (:data:`olmx.api.PUBLIC_MODULES`).
__all__ = ["hf_config_args"]


def offline() -> None:
    """Hub access off (``HF_HUB_OFFLINE=1``, also where ``huggingface_hub`` is already
    imported) and no progress bars; a ConfigError saying how to install ``transformers``
    where it is missing."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        import huggingface_hub.constants
        import transformers
    except ImportError:
        raise ConfigError(
            "transformers", "Hugging Face checkpoints need the hf extra: pip install 'olmx[hf]'"
        ) from None
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def hf_config_args(model: ModelConfig, vocab_size: int, intermediate_size: int) -> dict[str, Any]:
    """The keyword arguments every ``transformers`` config olmx writes shares (``LlamaConfig``, a
    layer's own: ``OlmoeConfig``, ``FlexOlmoConfig``): the model's shape with ``vocab_size``
    (the built model's padded vocabulary) and the feed-forward width ``intermediate_size``
    (``model.hidden_size``, an expert's width), SiLU, the RMSNorm epsilon, RoPE, no attention
    biases, untied embeddings. Public (``__all__``): a layer plugin's ``hf_checkpoint`` builds
    its config from them."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=model.d_model,
        intermediate_size=intermediate_size,
        num_hidden_layers=model.n_layers,
        num_attention_heads=model.n_heads,
        num_key_value_heads=model.n_kv_heads or model.n_heads,
        hidden_act="silu",
        rms_norm_eps=model.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(model.rope_theta)},
        attention_bias=False,
        tie_word_embeddings=False,
    )


def hf_config(model: Any, plan: Plan, arch: str) -> Any:
    """The ``transformers`` config of the built dense OLMo-core ``model``: OLMo-core's
    ``get_hf_config`` (OLMo 2/3), or the ``LlamaConfig`` of a pre-norm model."""
    from olmo_core.nn.hf import get_hf_config
    from transformers import LlamaConfig

    m = plan.run.model
    if arch == LLAMA:
        config = LlamaConfig(**hf_config_args(m, model.vocab_size, m.hidden_size), mlp_bias=False)
    else:
        config = get_hf_config(model)
    if config.model_type != arch:  # olmx's torch-free decision must be OLMo-core's
        raise RuntimeError(f"OLMo-core makes a {config.model_type} config of a model olmx planned as {arch}")
    return config


def dense_checkpoint(model: Any, plan: Plan, arch: str) -> tuple[Any, dict[str, Any]]:
    """The ``transformers`` config and state dict of the built dense ``model`` (weights loaded)
    as architecture ``arch``, through OLMo-core's conversion."""
    from olmo_core.distributed.utils import get_full_tensor
    from olmo_core.nn.hf import convert_state_to_hf

    config = hf_config(model, plan, arch)
    state = {k: get_full_tensor(v).detach().cpu() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous() for k, v in convert_state_to_hf(config, state).items()}
    want = hf_tensors(plan.run.model, model.vocab_size, arch)
    have = {k: tuple(v.shape) for k, v in hf_state.items()}
    if have != want:  # the plan's torch-free table must be OLMo-core's conversion
        raise RuntimeError(f"OLMo-core's {arch} conversion differs from olmx.plan.hf.hf_tensors: {have} != {want}")
    return config, hf_state


def save_hf(model: Any, plan: Plan, arch: str, out: Path) -> int:
    """Write the dense ``model`` (built from ``plan``, weights loaded) as a ``transformers``
    checkpoint of ``arch`` into the new directory ``out`` (:func:`write_hf`)."""
    config, state = dense_checkpoint(model, plan, arch)
    return write_hf(config, state, plan, ARCHITECTURES[arch][0], model.vocab_size, out)


def write_hf(config: Any, state: dict[str, Any], plan: Plan, cls: str, vocab_size: int, out: Path) -> int:
    """Write ``state`` as a ``transformers`` checkpoint of class ``cls`` configured by ``config``
    into the new directory ``out`` (config.json, generation_config.json, model.safetensors in
    the weights' dtype), with the run's token ids and trained context length; the number of
    tensors written. The state must fill the class exactly (loaded strictly). The embeddings
    keep the model's padded vocabulary, ``vocab_size`` (its logits are the model's); generation
    suppresses the padding ids."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = plan.run.data.tokenizer
    config.architectures = [cls]
    config.max_position_embeddings = plan.batch.seq_len
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_id, tok.eos_id, tok.pad_id
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config)
    if type(hf_model).__name__ != cls:
        raise RuntimeError(f"transformers builds a {type(hf_model).__name__} from the {cls} config")
    hf_model.load_state_dict(state, strict=True, assign=True)
    if tok.vocab_size < vocab_size:  # the padding ids are never generated (as in olmx generate)
        hf_model.generation_config.suppress_tokens = list(range(tok.vocab_size, vocab_size))
    hf_model.save_pretrained(out)
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():  # transformers writes the weights 0600 through a temporary file
        path.chmod(0o666 & ~umask)
    return len(state)


def load_init_from(model: Any, plan: Plan) -> str:
    """Load ``model.init_from``'s weights into the built, initialised and parallelised
    ``model`` on every rank (OLMo-core's ``load_hf_model``: each rank reads the checkpoint,
    converts its keys and takes its shard of each DTensor); the directory loaded."""
    raw = plan.run.model.init_from
    assert raw is not None
    directory = Path(os.path.expanduser(raw)).absolute()
    # Checked by the plan; a directory gone since must not reach load_hf_model, which would
    # take its name for a Hub model id.
    if not directory.is_dir():
        raise ConfigError("model.init_from", f"'{directory}' is no longer a directory (it was when the plan was made)")
    offline()
    from olmo_core.nn.hf import load_hf_model

    state = model.state_dict()
    load_hf_model(str(directory), state)
    model.load_state_dict(state)
    return str(directory)
