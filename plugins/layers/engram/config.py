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

    #: 0-based blocks that carry Engram; null: early and at half depth, scaled with the model:
    #: ``[1, n_layers // 2]`` (the official demo's [1, 15] for its 30 layers, where the paper
    #: says "2 and 15"; read the same way, the paper's best pair in its 12-layer ablation,
    #: "2 and 6", is [1, 6]; deeper placement is worse there); [1] for 2 or 3 blocks, [0] for one.
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
    #: Learning-rate multiplier of the tables' own parameter group (the paper: Adam, 5x the
    #: backbone's learning rate).
    table_lr_multiplier: float = 5.0
    #: Weight decay of the tables' group (the paper: none).
    table_weight_decay: float = 0.0
    #: Weight decay of Engram's parameters that are not matrices: the convolution kernel, the
    #: three RMSNorm gains and the two projection biases (the paper does not say); null:
    #: ``trainer.weight_decay``, as the backbone's own norm gains get. The key and value
    #: projections' matrices train with the backbone's learning rate and weight decay (the
    #: paper's backbone optimizer, Muon there).
    non_matrix_weight_decay: Optional[float] = None
    #: Standard deviation of the table initialisation; null: ``model.init_std``, the host
    #: embeddings' (OLMo-core: 0.02). The demo draws its tables and its token embeddings (its
    #: residual stream) both from N(0, 1); olmx keeps that ratio, so that Engram's output at
    #: initialisation is the demo's fraction of the token embeddings (0.31), not ~15x them. The
    #: projection biases start at ``nn.Linear``'s default times this value (over the demo's
    #: 1.0) for the same reason. Measured over 150 steps of engram_tiny: loss 1.54 (1.75 with
    #: 1.0); with OLMo 3-style blocks instead (reordered norm, QK-norm, eps 1e-6), whose
    #: residual at block 1 is ~0.75 at init, 0.02 still beats a std matched to it (1.66 / 1.75).
    table_init_std: Optional[float] = None


def default_layer_ids(n_layers: int) -> list[int]:
    """Engram blocks of a model of ``n_layers`` blocks when ``layer_ids`` is null: block 1
    (after one attention layer, so the gate's query has context; the paper finds early
    placement best) and the middle block ``n_layers // 2`` (the paper's second Engram layer,
    at half depth in both its 30-layer and 12-layer models; deeper is worse)."""
    if n_layers >= 4:
        return [1, n_layers // 2]
    return [1] if n_layers > 1 else [0]


def layer_ids(cfg: EngramLayerConfig, n_layers: int) -> list[int]:
    """The Engram blocks."""
    if cfg.layer_ids is not None:
        return list(cfg.layer_ids)
    return default_layer_ids(n_layers)


def table_init_std(cfg: EngramLayerConfig, init_std: float) -> float:
    """The tables' initialisation std: ``table_init_std``, else the model's ``init_std``."""
    return float(cfg.table_init_std) if cfg.table_init_std is not None else float(init_std)


def vocab_sizes(cfg: EngramLayerConfig, vocab: int) -> list[int]:
    """Configured rows per head, per order."""
    if cfg.vocab_size_per_ngram is not None:
        return list(cfg.vocab_size_per_ngram)
    return [VOCAB_MULTIPLE * vocab] * (cfg.max_ngram_size - 1)
