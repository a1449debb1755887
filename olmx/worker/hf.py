"""OLMo-core models <-> Hugging Face ``transformers`` checkpoints, through OLMo-core 3.0.0's
conversion (``olmo_core.nn.hf``): its key mappings both ways (``convert_state_to_hf``, and
``load_hf_model``, which converts and places the weights on DTensor/FSDP shards), and its
``get_hf_config`` for OLMo 2/3 models; olmx writes the ``LlamaConfig`` of pre-norm models,
which OLMo-core maps but has no config builder for. Which olmx model is which architecture:
:mod:`olmx.plan.hf`.

Nothing here reaches the Hugging Face Hub: every path is a local directory, and
:func:`offline` switches ``huggingface_hub`` to offline mode first. ``transformers`` is
imported only here (the ``olmx[hf]`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError
from olmx.plan import Plan
from olmx.plan.hf import ARCHITECTURES, LLAMA, hf_tensors


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


def hf_config(model: Any, plan: Plan, arch: str) -> Any:
    """The ``transformers`` config of the built OLMo-core ``model``: OLMo-core's
    ``get_hf_config`` (OLMo 2/3), or the ``LlamaConfig`` of a pre-norm model; with the run's
    token ids and trained context length."""
    from olmo_core.nn.hf import get_hf_config
    from transformers import LlamaConfig

    m, tok = plan.run.model, plan.run.data.tokenizer
    if arch == LLAMA:
        config = LlamaConfig(
            vocab_size=model.vocab_size,
            hidden_size=m.d_model,
            intermediate_size=m.hidden_size,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            num_key_value_heads=m.n_kv_heads or m.n_heads,
            hidden_act="silu",
            rms_norm_eps=m.layer_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_theta)},
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        )
    else:
        config = get_hf_config(model)
    if config.model_type != arch:  # olmx's torch-free decision must be OLMo-core's
        raise RuntimeError(f"OLMo-core makes a {config.model_type} config of a model olmx planned as {arch}")
    config.architectures = [ARCHITECTURES[arch][0]]
    config.max_position_embeddings = plan.batch.seq_len
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_id, tok.eos_id, tok.pad_id
    return config


def save_hf(model: Any, plan: Plan, arch: str, out: Path) -> int:
    """Write ``model`` (built from ``plan``, weights loaded) as a ``transformers`` checkpoint
    into the new directory ``out`` (config.json, generation_config.json, model.safetensors in
    the weights' dtype); the number of tensors written. The embeddings keep the model's padded
    vocabulary (its logits are the model's); generation suppresses the padding ids."""
    import torch
    from olmo_core.distributed.utils import get_full_tensor
    from olmo_core.nn.hf import convert_state_to_hf
    from transformers import AutoModelForCausalLM

    config = hf_config(model, plan, arch)
    state = {k: get_full_tensor(v).detach().cpu() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous() for k, v in convert_state_to_hf(config, state).items()}
    want = hf_tensors(plan.run.model, model.vocab_size, arch)
    have = {k: tuple(v.shape) for k, v in hf_state.items()}
    if have != want:  # the plan's torch-free table must be OLMo-core's conversion
        raise RuntimeError(f"OLMo-core's {arch} conversion differs from olmx.plan.hf.hf_tensors: {have} != {want}")
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config)
    hf_model.load_state_dict(hf_state, strict=True, assign=True)
    vocab = plan.run.data.tokenizer.vocab_size
    if vocab < model.vocab_size:  # the padding ids are never generated (as in olmx generate)
        hf_model.generation_config.suppress_tokens = list(range(vocab, model.vocab_size))
    hf_model.save_pretrained(out)
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():  # transformers writes the weights 0600 through a temporary file
        path.chmod(0o666 & ~umask)
    return len(hf_state)


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
