"""The model's ``nn.Linear`` layers as the plan sees them, without torch.

:func:`dense_linears` lists the layers of the OLMo-core llama-like transformer that
:class:`olmx.config.schema.ModelConfig` builds (a test compares it with the built model).
Layer plugins that replace or add modules edit the list through their hook
:meth:`olmx.api.LayerPlugin.linear_layers` (in the order they edit the model; the whole list is
:meth:`olmx.api.Context.linear_layers`), so that what a precision plugin plans to convert
(MXFP8, FP8) is what the worker converts in the built model. A layer that must stay in high
precision whatever the precision plugin says carries the reason (``keep``): whoever adds the
layer knows why, so no precision plugin needs another plugin's module names.
"""

from __future__ import annotations

from typing import Any

from olmx.types import LinearLayer

#: Why the output head is never converted to a low-precision format.
HEAD_KEEP = "output head: its logits feed the softmax and loss (OLMo-core never converts it)"


def dense_linears(model: Any, vocab_size: int) -> list[LinearLayer]:
    """The linear layers of the dense model ``model`` (a ``ModelConfig``) with a ``vocab_size`` head."""
    head_dim = model.d_model // model.n_heads
    q, kv = model.n_heads * head_dim, (model.n_kv_heads or model.n_heads) * head_dim
    d, h = model.d_model, model.hidden_size
    block = [
        ("attention.w_q", d, q),
        ("attention.w_k", d, kv),
        ("attention.w_v", d, kv),
        ("attention.w_out", q, d),
        ("feed_forward.w1", d, h),
        ("feed_forward.w2", h, d),
        ("feed_forward.w3", d, h),
    ]
    layers = [LinearLayer(f"blocks.{i}.{n}", a, b) for i in range(model.n_layers) for n, a, b in block]
    return layers + [LinearLayer("lm_head.w_out", d, vocab_size, keep=HEAD_KEEP)]
