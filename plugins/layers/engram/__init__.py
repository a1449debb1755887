"""Engram conditional memory (DeepSeek, arXiv 2601.07372) for OLMo-core models.

Importing this package is cheap: the torch / OLMo-core code loads on first attribute access
(PEP 562). Pieces:

* :class:`EngramLayerConfig` (``config``): the one config users write (``layers.engram``),
  torch-free; the plugin (``plugin``) validates it at plan time and derives the rest.
* :class:`TokenizerCompression` (``compression``): raw token ids -> canonical ids, built from
  the run's tokenizer (:func:`byte_level_tokens`, :func:`hf_tokens`).
* :class:`NgramHasher` (``hashing``): canonical ids -> per-head table ids, in torch.
* :class:`Engram` (``module``): lookup, gate, short convolution of one layer.
* :class:`EngramTable` (``sharding``): the packed table, replicated or ``1d``/``2d`` sharded.
* :class:`EngramConfig`, :class:`EngramBlockConfig`, :func:`apply_engram_inputs` (``block``):
  the OLMo-core block configs (derived from :class:`EngramLayerConfig`), the block and the
  model seam that passes hash ids to the blocks.
* :func:`apply_ddp_ignoring` (``ddp``): OLMo-core's ``apply_ddp`` with sharded tables left out.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngramLayerConfig": "config",
    "TokenizerCompression": "compression",
    "byte_level_tokens": "compression",
    "canonical_ids": "compression",
    "hf_tokens": "compression",
    "normalize_token_text": "compression",
    "NgramHasher": "hashing",
    "ngram_table_sizes": "hashing",
    "Engram": "module",
    "EngramTable": "sharding",
    "TableCommStats": "sharding",
    "TableSharding": "sharding",
    "collect_comm_stats": "sharding",
    "ENGRAM_HASH_IDS_KWARG": "block",
    "TABLE_PARAM_PATTERN": "block",
    "NON_MATRIX_PARAM_PATTERNS": "block",
    "EngramBlockConfig": "block",
    "EngramConfig": "block",
    "EngramInputs": "block",
    "EngramTransformer": "block",
    "apply_engram_inputs": "block",
    "apply_ddp_ignoring": "ddp",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
