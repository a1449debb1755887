"""Plan -> OLMo-core model config and model. The only place that builds OLMo-core models."""

from __future__ import annotations

from typing import Any

from olmx.config.schema import ModelConfig
from olmx.plan import Plan


def attention_backend(
    name: str, *, device: str, compute_dtype: str = "float32", compute_capability: tuple[int, int] | None = None
) -> str:
    """The attention kernel for ``model.attn_backend`` (the plan's ``execution.attention``) on
    this worker: ``auto`` is flash-attn 3 on SM90+ where installed, else flash-attn 2 where
    installed, else torch SDPA, when the run computes in 16 bits on CUDA (flash-attention
    takes only 16-bit inputs); torch SDPA otherwise."""
    if name != "auto":
        return name
    if device == "cuda" and compute_dtype != "float32":
        import importlib.util

        if (
            compute_capability is not None
            and compute_capability >= (9, 0)
            and importlib.util.find_spec("flash_attn_interface")
        ):
            return "flash_3"
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_2"
    return "torch"


def build_model_config(model: ModelConfig, *, vocab_size: int, attention: str = "torch") -> Any:
    """OLMo-core ``TransformerConfig`` for ``model`` (llama-like; OLMo 2/3 through the block
    type, QK-norm and sliding-window settings)."""
    from olmo_core.config import DType
    from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    sliding = None
    if model.sliding_window:
        sliding = SlidingWindowAttentionConfig(
            pattern=list(model.sliding_window),
            force_full_attention_on_first_layer=False,
            force_full_attention_on_last_layer=True,
        )
    return TransformerConfig.llama_like(
        d_model=model.d_model,
        vocab_size=vocab_size,
        n_layers=model.n_layers,
        n_heads=model.n_heads,
        n_kv_heads=model.n_kv_heads,
        qk_norm=model.qk_norm,
        layer_norm_eps=model.layer_norm_eps,
        rope_theta=model.rope_theta,
        block_name=TransformerBlockType(model.block),
        attn_backend=AttentionBackendName(attention),
        sliding_window=sliding,
        feed_forward=FeedForwardConfig(hidden_size=model.hidden_size, bias=False, dtype=DType.float32),
        init_std=model.init_std,
    )


def build_model(plan: Plan, reg: Any) -> Any:
    """The model on the meta device, edited in this order before any parallelism is applied
    (where OLMo-core's ``parallelize_model`` applies ``float8_config``): the layer plugins (by
    their ``order``: config, then the built model), the precision plugin (module swaps such as
    MXFP8 linears, which must see the layers' modules too), the parallel plugins (e.g. the
    Ulysses attention wrapper)."""
    run = plan.run
    cc = None
    if plan.world.device == "cuda":
        import torch

        cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else plan.world.compute_capability
    attention = attention_backend(
        plan.execution.attention, device=plan.world.device, compute_dtype=plan.dtypes.param, compute_capability=cc
    )
    config = build_model_config(run.model, vocab_size=plan.vocab_size, attention=attention)
    layers = reg.layers_in_order(run.layers)
    for _, layer, cfg in layers:
        config = layer.apply_model_config(cfg, config, plan)
    model = config.build(init_device="meta")
    for _, layer, cfg in layers:
        layer.apply_model(cfg, model, plan)
    reg.get("precision", run.precision_name).apply_model(run.precision[run.precision_name], model, plan)
    for name, cfg in run.parallel.items():
        reg.get("parallel", name).apply_model(cfg, model, plan)
    return model
