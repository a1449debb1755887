"""MoE models as Hugging Face ``transformers`` checkpoints: OLMoE and FlexOlmo.

Which model is which (checked without torch by :func:`hf_class`, before anything is loaded):

* experts in every block, ``model.qk_norm=true``, no sliding window, softmax routing without a
  selection bias or a shared expert, every token routed (no ``capacity_factor``), and the top-k
  weights as they are (``normalize_expert_weights`` null: ``norm_topk_prob=false``) or summing
  to one (``1.0``: ``norm_topk_prob=true``);
* ``model.block=default`` (pre-norm): **OLMoE** (``OlmoeForCausalLM``);
* ``model.block=reordered_norm`` (OLMo 2 post-norm): **FlexOlmo** (``FlexOlmoForCausalLM``).

Both keep a layer's experts as two 3-D tensors, ``mlp.experts.gate_up_proj [E, 2h, d]`` (the
SiLU-gated projection's rows, then the up projection's) and ``mlp.experts.down_proj [E, d, h]``,
and the router as ``mlp.gate.weight [E, d]``, with softmax over all experts, then top-k. The
other tensors (embeddings, attention, QK-norm, block norms, head) are OLMo-core's conversion
(``olmo_core.nn.hf.convert_state_to_hf``: FlexOlmo's keys are OLMo 2's, OLMoE's norms Llama's).
A run on the ``olmo_core`` backend is first brought to the portable layout (:mod:`.convert`).
"""

from __future__ import annotations

from typing import Any

from olmx.errors import ConfigError
from olmx_plugins.layers.moe.config import MoEConfig, expert_hidden, moe_blocks

#: ``model.block`` -> the ``transformers`` causal-LM class that holds an MoE model of it.
CLASSES = {"default": "OlmoeForCausalLM", "reordered_norm": "FlexOlmoForCausalLM"}


def hf_class(cfg: MoEConfig, run: Any) -> str:
    """The ``transformers`` class of the run's MoE model (:data:`CLASSES`), or a
    :class:`ConfigError` naming the setting that has none, and why."""
    m = run.model
    blocks = moe_blocks(cfg, m.n_layers)
    if len(blocks) != m.n_layers:
        field = "layers.moe.blocks" if cfg.blocks is not None else "layers.moe.every"
        why = "OLMoE and FlexOlmo have them in every block"
        fix = "layers.moe.blocks=null layers.moe.every=1" if cfg.blocks is not None else "layers.moe.every=1"
        raise ConfigError(field, f"experts in blocks {blocks} of {m.n_layers}: {why}; {fix} makes it one")
    shared = cfg.shared_hidden_size is not None
    refusals = [
        (shared, "layers.moe.shared_hidden_size", "OLMoE and FlexOlmo have no shared expert", "null"),
        (
            cfg.gating != "softmax",
            "layers.moe.gating",
            "OLMoE and FlexOlmo route with a softmax over the experts",
            "softmax",
        ),
        (
            cfg.bias_gamma is not None,
            "layers.moe.bias_gamma",
            "OLMoE and FlexOlmo choose experts without a bias",
            "null",
        ),
        (
            cfg.capacity_factor is not None,
            "layers.moe.capacity_factor",
            "OLMoE and FlexOlmo route every token, where a capacity drops some",
            "null",
        ),
        (
            cfg.normalize_expert_weights not in (None, 1.0),
            "layers.moe.normalize_expert_weights",
            "OLMoE and FlexOlmo use the top-k weights as they are (null) or summing to one (1.0)",
            "null",
        ),
        (not m.qk_norm, "model.qk_norm", "OLMoE and FlexOlmo normalise queries and keys in every layer", "true"),
        (
            any(w != -1 for w in m.sliding_window or []),
            "model.sliding_window",
            "OLMoE and FlexOlmo attend to the whole context in every layer",
            "null",
        ),
    ]
    for refused, field, why, value in refusals:
        if refused:
            raise ConfigError(
                field, f"{why}, so no transformers architecture computes this MoE model; {field}={value} makes it one"
            )
    if m.block not in CLASSES:
        raise ConfigError("model.block", f"{m.block}: OLMoE is pre-norm (default), FlexOlmo post-norm (reordered_norm)")
    return CLASSES[m.block]


def hf_checkpoint(cfg: MoEConfig, model: Any, plan: Any, backend: str) -> tuple[Any, dict[str, Any]]:
    """The ``transformers`` config and state dict (full CPU tensors) of the built, loaded MoE
    ``model`` (``backend``: the layout its MoE state is in)."""
    import torch
    from olmo_core.distributed.utils import get_full_tensor
    from olmo_core.nn.hf import convert_state_to_hf
    from transformers import FlexOlmoConfig, LlamaConfig, OlmoeConfig

    from olmx.worker.hf import hf_config_args
    from olmx_plugins.layers.moe.convert import PORTABLE_MOE_ATTR, convert_model_state_dict

    m = plan.run.model
    h = expert_hidden(cfg, m)
    state = {k: get_full_tensor(v).detach().cpu() for k, v in model.state_dict().items()}
    if backend == "olmo_core":
        state = convert_model_state_dict(
            state, to="portable", num_experts=cfg.num_experts, d_model=m.d_model, hidden_size=h, dropless=True
        )
    common = hf_config_args(m, model.vocab_size, h)
    moe: dict[str, Any] = dict(
        num_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=cfg.normalize_expert_weights == 1.0
    )
    if m.block == "default":
        config: Any = OlmoeConfig(**common, **moe, clip_qkv=None)
        dense_keys: Any = LlamaConfig(**common)  # OLMoE's norms are named as Llama's
    else:
        config = FlexOlmoConfig(**common, **moe)
        dense_keys = config
    experts = f".{PORTABLE_MOE_ATTR}."
    out = convert_state_to_hf(dense_keys, {k: v for k, v in state.items() if experts not in k})
    for i in range(m.n_layers):
        mine, theirs = f"blocks.{i}{experts}", f"model.layers.{i}.mlp."
        w1, w2, w3 = (state[f"{mine}experts.{w}"] for w in ("w1", "w2", "w3"))  # [E,d,h], [E,h,d], [E,d,h]
        out[theirs + "gate.weight"] = state[f"{mine}router.weight"]
        out[theirs + "experts.gate_up_proj"] = torch.cat([w1.transpose(1, 2), w3.transpose(1, 2)], dim=1)
        out[theirs + "experts.down_proj"] = w2.transpose(1, 2)
    names = ("router.weight", "experts.w1", "experts.w2", "experts.w3")
    mapped = {f"blocks.{i}{experts}{name}" for i in range(m.n_layers) for name in names}
    if unmapped := sorted(k for k in state if experts in k and k not in mapped):
        raise RuntimeError(f"MoE state the export does not map: {unmapped}")
    return config, {k: v.contiguous() for k, v in out.items()}
