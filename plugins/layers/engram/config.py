"""``layers=[engram]``: the one config of the Engram plugin, and what is derived from it.

:class:`EngramLayerConfig` is what users write (Hydra schema, ``olmx plugins show engram``).
The plugin's ``resolve`` is the one place that validates it (``olmx.errors.ConfigError`` at
plan time); the OLMo-core-side :class:`~.block.EngramConfig` is built from the validated
config (``EngramLayer.engram_config``, with :func:`layer_ids` and :func:`vocab_sizes` resolving
its nulls against the model), takes its defaults from this class and checks nothing again.
Torch-free: the plan imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: Values of ``sharding`` (those of :class:`~.sharding.TableSharding`).
SHARDINGS = ("replicated", "1d", "2d")
#: The official demo sizes each head's table at 5 x the tokenizer vocabulary (129280 * 5).
VOCAB_MULTIPLE = 5


@dataclass
class EngramLayerConfig:
    """Settings of ``layers=[engram]`` (defaults: the official demo, scaled to the run)."""

    #: 0-based blocks that carry Engram; null: the demo's [1, 15] where the model is deep
    #: enough, else [1].
    layer_ids: Optional[list[int]] = None
    #: N: hash n-grams of orders 2..N (also the convolution's dilation).
    max_ngram_size: int = 3
    #: K: hash heads (tables) per order.
    n_head_per_ngram: int = 8
    #: Width of one order's concatenated heads (each head's rows are this / K wide).
    n_embed_per_ngram: int = 512
    #: Configured rows of each head's table, per order (N-1 entries; the real sizes are the
    #: next unused primes above); null: 5 x the padded vocabulary, as the demo (129280 x 5).
    vocab_size_per_ngram: Optional[list[int]] = None
    #: Kernel of the causal depthwise convolution.
    kernel_size: int = 4
    #: Seed of the hash multipliers (numpy default_rng(seed + 10007 * layer)).
    seed: int = 0
    #: Start the convolution at zero (the paper); false: Conv1d's default init (the demo).
    zero_init_conv: bool = True
    #: Collapse token ids that normalise to the same text (NFKC, NFD, strip accents,
    #: lowercase, whitespace) before hashing; needs the run's tokenizer (bytes: built in).
    compression: bool = True
    #: ``replicated`` (plain parameters), ``1d`` (rows split over all ranks) or ``2d`` (rows
    #: split within groups of ``shard_degree`` ranks, replicated across groups).
    sharding: str = "replicated"
    #: Ranks per shard group for ``sharding=2d``.
    shard_degree: Optional[int] = None
    #: Learning-rate multiplier of the tables' own parameter group (no weight decay).
    table_lr_multiplier: float = 5.0
    #: Standard deviation of the table initialisation (the demo: nn.Embedding's 1.0).
    table_init_std: float = 1.0


def layer_ids(cfg: EngramLayerConfig, n_layers: int) -> list[int]:
    """The Engram blocks."""
    if cfg.layer_ids is not None:
        return list(cfg.layer_ids)
    return [1, 15] if n_layers > 15 else [1] if n_layers > 1 else [0]


def vocab_sizes(cfg: EngramLayerConfig, vocab: int) -> list[int]:
    """Configured rows per head, per order."""
    if cfg.vocab_size_per_ngram is not None:
        return list(cfg.vocab_size_per_ngram)
    return [VOCAB_MULTIPLE * vocab] * (cfg.max_ngram_size - 1)
