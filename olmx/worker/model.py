"""Plan -> OLMo-core model config and model. The only place that builds OLMo-core models."""

from __future__ import annotations

from typing import Any

from olmx.config.schema import ModelConfig
from olmx.kinds import MODEL_KINDS, plugins_in_order
from olmx.plan import Plan
from olmx.plan.execution import windows_matter


def attention_backend(
    name: str, *, device: str, compute_dtype: str = "float32", compute_capability: tuple[int, int] | None = None
) -> str:
    """The attention kernel for ``model.attn_backend`` (the plan's ``execution.attention``) on
    this worker: ``auto`` is flash-attention 3 on Hopper (SM 9.x, the only GPUs OLMo-core runs
    it on) where it imports, else flash-attention 2 where it imports, else torch SDPA, when the
    run computes in 16 bits on CUDA (flash-attention takes only 16-bit inputs); torch SDPA
    otherwise. "Imports" is OLMo-core's own test (``olmo_core.nn.attention.flash_attn_api``):
    a package that is installed but built for another torch fails to import and is not
    chosen, and flash-attention 3 is found under both of its module names."""
    if name != "auto":
        return name
    if device == "cuda" and compute_dtype != "float32":
        from olmo_core.nn.attention import flash_attn_api

        hopper = compute_capability is not None and (9, 0) <= compute_capability < (10, 0)
        if hopper and flash_attn_api.flash_attn_3 is not None:
            return "flash_3"
        if flash_attn_api.flash_attn_2 is not None:
            return "flash_2"
    return "torch"


def build_model_config(
    model: ModelConfig, *, vocab_size: int, attention: str = "torch", seq_len: int | None = None, init_seed: int = 0
) -> Any:
    """OLMo-core ``TransformerConfig`` for ``model`` (llama-like; OLMo 2/3 through the block
    type, QK-norm and sliding-window settings).

    ``seq_len``: the longest sequence the model will be run on. Where every sliding window
    covers it (:func:`windows_matter`), the windows are left out: the attention is the same,
    but OLMo-core's torch backend would pass SDPA an explicit ``seq_len x seq_len`` mask for a
    windowed layer, which rules out SDPA's flash kernel (full S^2 work and memory). OLMo 3's
    presets have 4,096-token windows, so this is every OLMo 3 run at ``data.seq_len <= 4096``.
    None keeps the windows as configured (the architecture, for export).

    ``init_seed``: the seed of OLMo-core's weight initialisation (``trainer.seed`` in a run;
    OLMo-core draws every weight from one generator seeded with it)."""
    from olmo_core.config import DType
    from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    sliding = None
    if model.sliding_window and windows_matter(model.sliding_window, seq_len):
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
        init_seed=init_seed,
    )


def build_model(plan: Plan, reg: Any, *, keep_windows: bool = False) -> Any:
    """The model on the meta device, edited in this order before any parallelism is applied
    (where OLMo-core's ``parallelize_model`` applies ``float8_config``): the layer plugins (by
    their ``order``: config, then the built model), the precision plugin (module swaps such as
    MXFP8 linears, which must see the layers' modules too), the parallel plugins (e.g. the
    Ulysses attention wrapper); under pipeline parallelism the built model's edits wait for the
    split (:func:`edit_model`).

    Sliding windows that cover ``data.seq_len`` are left out (:func:`build_model_config`)
    unless ``keep_windows`` (export: the architecture as configured)."""
    run = plan.run
    cc = None
    if plan.world.device == "cuda":
        import torch

        cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else plan.world.compute_capability
    attention = attention_backend(
        plan.execution.attention, device=plan.world.device, compute_dtype=plan.dtypes.param, compute_capability=cc
    )
    seq_len = None if keep_windows else plan.batch.seq_len
    config = build_model_config(
        run.model, vocab_size=plan.vocab_size, attention=attention, seq_len=seq_len, init_seed=run.trainer.seed
    )
    layers: list[tuple[Any, Any]] = plugins_in_order(run, reg, ("layer",))  # LayerPlugin instances
    for layer, cfg in layers:
        config = layer.apply_model_config(cfg, config, plan)
    model = config.build(init_device="meta")
    if plan.mesh.pp == 1:  # else each stage, after the split (olmx.worker.pipeline)
        edit_model(plan, reg, model)
    skip_unused_mask_warmup(model)
    return model


def edit_model(plan: Plan, reg: Any, model: Any) -> None:
    """The plugins' ``apply_model`` edits of the built model (or of one pipeline stage of it), in
    :data:`olmx.kinds.KIND_ORDER`: the layer plugins by their ``order``, the precision plugin,
    the parallel plugins. Under pipeline parallelism they edit each stage after OLMo-core's
    split, which deep-copies the model once per stage: a module an edit wraps with FSDP (the
    experts under expert parallelism) cannot be copied, and a stage's edits use the process
    groups of its ranks."""
    editors: list[tuple[Any, Any]] = plugins_in_order(plan.run, reg, MODEL_KINDS)  # each has apply_model
    for plugin, cfg in editors:
        plugin.apply_model(cfg, model, plan)


def skip_unused_mask_warmup(model: Any) -> int:
    """Stop OLMo-core from building attention masks that full causal attention never reads;
    returns how many backends were changed.

    OLMo-core 3.0.0's ``Transformer.init_weights(max_seq_len=...)`` (run by its train module)
    warms every torch-SDPA backend's mask cache with ``tril(ones(S, S, bool))``: ``2 S^2``
    bytes at once (one S x S bool tensor and its ``tril``), 2 GiB at ``data.seq_len=32768`` and
    8 GiB at 65536, freed again because full causal attention calls SDPA with ``is_causal``.
    That transient set the peak of long-sequence runs (a one-layer ``d_model=32`` model: 8.6 GiB
    at 65536 tokens) and, under Ulysses, grew with the whole sequence rather than a rank's
    share. Backends with a sliding window, and attention with sinks, do use the mask; they
    keep the warmup (and build the mask at their first forward anyway)."""
    from olmo_core.nn.attention import Attention
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    changed = 0
    for module in model.modules():
        if not isinstance(module, Attention) or module.sinks is not None:
            continue
        for backend in module.backend.modules() if module.backend is not None else ():  # wrappers included
            if isinstance(backend, TorchAttentionBackend) and tuple(backend.window_size) == (-1, -1):
                backend.warmup_cache = _no_warmup
                changed += 1
    return changed


def _no_warmup(max_seq_len: int, device: Any) -> None:
    """``warmup_cache`` of a backend that needs no mask: nothing to build."""
    del max_seq_len, device
