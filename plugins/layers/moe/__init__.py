"""Portable mixture-of-experts layer for olmx (issue 4).

OLMo-core 3.0.0's own MoE needs Triton (v1) or CUDA streams (v2), so it cannot train on CPU.
This package is olmx's reference MoE that runs everywhere (CPU/gloo and GPU/NCCL):

* :mod:`.config`: ``MoEConfig``, the one config users write (``layers.moe``), torch-free;
* :mod:`.plugin`: the layer plugin, which validates it at plan time and derives the rest;
* :mod:`.modules`: router, routed experts, shared expert, dispatch and aux losses (pure torch);
* :mod:`.block`: ``MoEBlockConfig``, an OLMo-core ``TransformerBlockConfig`` whose block uses
  the portable MoE as its feed-forward, and ``MoEFeedForwardConfig`` (both derived from
  ``MoEConfig``);
* :mod:`.convert`: checkpoint conversion between the portable and OLMo-core v1 layouts;
* :mod:`.seeded_init`: the OLMo-core v1 layers initialised as the portable ones (one seed, one
  initial model, whichever backend);
* :mod:`.expert_parallel`: expert parallelism over a process group (``all_to_all_single``).

Importing this package is cheap: the names below are loaded on first access (PEP 562), so
torch and OLMo-core are imported only when they are used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MoEConfig": "config",
    "MoEFeedForward": "modules",
    "MoERouter": "modules",
    "MoEExperts": "modules",
    "SharedExpert": "modules",
    "moe_layers": "modules",
    "v1_state_dict_to_portable": "convert",
    "portable_state_dict_to_v1": "convert",
    "convert_model_state_dict": "convert",
    "MoEFeedForwardConfig": "block",
    "MoEBlockConfig": "block",
    "MoEBlock": "block",
    "apply_expert_parallel": "expert_parallel",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
