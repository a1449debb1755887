"""``layers=[engram]``: the one config of the Engram plugin, and what is derived from it.

:class:`EngramLayerConfig` is what users write (Hydra schema, ``olmx plugins show engram``).
Its fields declare their own rules (``olmx.api.setting``, checked before ``resolve``); the
plugin's ``resolve`` checks what joins them (``olmx.errors.ConfigError`` at plan time). The
OLMo-core-side :class:`~.block.EngramConfig` is built from the validated config
(``EngramLayer.engram_config``, with :func:`layer_ids` and :func:`vocab_sizes` resolving its
nulls against the model), takes its defaults from this class and checks nothing again.
Torch-free: the plan imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from olmx.api import setting
from olmx.errors import ConfigError

#: Values of ``sharding``: ``auto`` and those of :class:`~.sharding.TableSharding`.
Sharding = StrEnum("Sharding", [("auto", "auto"), ("replicated", "replicated"), ("1d", "1d"), ("2d", "2d")])
#: ``sharding=auto`` shards (``1d``) where the world has more than one rank and the tables'
#: replicated training state (:data:`STATE_BYTES_PER_PARAM` per parameter) exceeds this: 1 GiB
#: per rank, ~67M table parameters. Below it the dense all-reduce of a replicated table costs
#: little and keeps small (test) runs on the plain path.
AUTO_SHARD_MIN_BYTES = 1 << 30
#: Bytes per table parameter of training state: float32 weight, float32 gradient and Adam's two
#: float32 moments.
STATE_BYTES_PER_PARAM = 16
#: Largest ``max_ngram_size``: orders beyond the paper's 2-3 add tables that hash ever rarer
#: n-grams (and the plan lists every order: 2**31 of them took more than 6 GiB to plan).
MAX_NGRAM = 16
#: The official demo sizes each head's table at 5 x the tokenizer vocabulary (129280 * 5).
VOCAB_MULTIPLE = 5


@dataclass(frozen=True)
class EngramLayerConfig:
    """Settings of ``layers=[engram]`` (defaults: the official demo, scaled to the run)."""

    #: 0-based blocks that carry Engram; null: early and at half depth, scaled with the model:
    #: ``[1, n_layers // 2]`` (the official demo's [1, 15] for its 30 layers, where the paper
    #: says "2 and 15"; read the same way, the paper's best pair in its 12-layer ablation,
    #: "2 and 6", is [1, 6]; deeper placement is worse there); [1] for 2 or 3 blocks, [0] for one.
    layer_ids: Optional[list[int]] = setting(None, ge=0, items=True, integer=True)
    #: N: hash n-grams of orders 2..N (also the convolution's dilation); at most
    #: :data:`MAX_NGRAM` (the paper uses 2-3; each order adds K tables).
    max_ngram_size: int = setting(3, ge=2, le=MAX_NGRAM)
    #: K: hash heads (tables) per order.
    n_head_per_ngram: int = setting(8, ge=1, divides="n_embed_per_ngram")
    #: Width of one order's concatenated heads (each head's rows are this / K wide).
    n_embed_per_ngram: int = setting(512, ge=1)
    #: Configured rows of each head's table, per order (N-1 entries; the real sizes are the
    #: next unused primes above); null: 5 x the padded vocabulary, as the demo (129280 x 5).
    vocab_size_per_ngram: Optional[list[int]] = setting(None, ge=2, items=True, integer=True)
    #: Kernel of the causal depthwise convolution.
    kernel_size: int = setting(4, ge=1)
    #: Seed of the hash multipliers (numpy default_rng(seed + 10007 * layer)).
    seed: int = setting(0, ge=0)
    #: Start the convolution at zero (the paper); false: Conv1d's default init (the demo).
    zero_init_conv: bool = True
    #: Collapse token ids that normalise to the same text (NFKC, NFD, strip accents,
    #: lowercase, whitespace) before hashing; needs the run's tokenizer (bytes: built in).
    compression: bool = True
    #: ``replicated`` (plain parameters), ``1d`` (rows split over all ranks), ``2d`` (rows
    #: split within groups of ``shard_degree`` ranks, replicated across groups) or ``auto``:
    #: ``1d`` where the world has more than one rank and the tables' replicated training state
    #: (16 bytes a parameter: weight, gradient, Adam's moments) exceeds
    #: :data:`AUTO_SHARD_MIN_BYTES` (1 GiB) per rank, else ``replicated``; the plan says which.
    sharding: Sharding = setting(Sharding("auto"))
    #: Ranks per shard group for ``sharding=2d``.
    shard_degree: Optional[int] = setting(None, ge=1, integer=True)
    #: Learning-rate multiplier of the tables' own parameter group (the paper: Adam, 5x the
    #: backbone's learning rate).
    table_lr_multiplier: float = setting(5.0, gt=0)
    #: Weight decay of the tables' group (the paper: none).
    table_weight_decay: float = setting(0.0, ge=0)
    #: Weight decay of Engram's parameters that are not matrices: the convolution kernel, the
    #: three RMSNorm gains and the two projection biases (the paper does not say); null:
    #: ``trainer.weight_decay``, as the backbone's own norm gains get. The key and value
    #: projections' matrices train with the backbone's learning rate and weight decay (the
    #: paper's backbone optimizer, Muon there).
    non_matrix_weight_decay: Optional[float] = setting(None, ge=0)
    #: Standard deviation of the table initialisation; null: ``model.init_std``, the host
    #: embeddings' (OLMo-core: 0.02). The demo draws its tables and its token embeddings (its
    #: residual stream) both from N(0, 1); olmx keeps that ratio, so that Engram's output at
    #: initialisation is the demo's fraction of the token embeddings (0.31), not ~15x them. The
    #: projection biases start at ``nn.Linear``'s default times this value (over the demo's
    #: 1.0) for the same reason. Measured over 150 steps of engram_tiny: loss 1.54 (1.75 with
    #: 1.0); with OLMo 3-style blocks instead (reordered norm, QK-norm, eps 1e-6), whose
    #: residual at block 1 is ~0.75 at init, 0.02 still beats a std matched to it (1.66 / 1.75).
    table_init_std: Optional[float] = setting(None, gt=0)


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


def rows_per_rank(num_rows: int, shards: int) -> int:
    """Rows of the largest shard when ``num_rows`` rows are split over ``shards`` ranks
    (``torch.chunk`` sizes, as sharded tables and FSDP2 split dimension 0)."""
    return -(-num_rows // shards)


def table_state_bytes_per_rank(
    table_rows: list[int], dim: int, *, sharding: str, world: int, shard_degree: int | None = None, fsdp_shard: int = 1
) -> int:
    """Bytes of the tables' training state (:data:`STATE_BYTES_PER_PARAM` per parameter) on
    the rank holding the most rows. ``table_rows``: rows of each layer's packed table.
    ``replicated``: whole tables, or their ``fsdp_shard``-way FSDP shards (FSDP still gathers a
    whole table, and makes its whole gradient, at each use); ``1d``: ``world``-way row shards;
    ``2d``: ``shard_degree``-way."""
    shards = {"replicated": fsdp_shard, "1d": world, "2d": shard_degree or 1}[sharding]
    return sum(rows_per_rank(rows, shards) * dim for rows in table_rows) * STATE_BYTES_PER_PARAM


def choose_sharding(
    cfg: EngramLayerConfig, *, world: int, table_params: int, pipeline: bool = False
) -> tuple[str, str]:
    """``(sharding, why)``: ``layers.engram.sharding``, with ``auto`` decided by the rule at
    :data:`AUTO_SHARD_MIN_BYTES` (``world``: ranks; ``table_params``: all layers' tables).
    Under a pipeline (``pipeline``) the tables are replicated: a sharded table's lookups are
    exchanged among all ranks, but only the ranks of the stage that holds its block look up."""
    if pipeline:
        if cfg.sharding not in ("auto", "replicated"):
            raise ConfigError(
                "layers.engram.sharding",
                f"{cfg.sharding} shards each table over all ranks and exchanges its lookups among them, but under "
                "pipeline parallelism only the ranks of the stage that holds its block look up: use replicated "
                "(or auto) with a pipeline",
            )
        return (
            "replicated",
            "auto: a pipeline (each table on the stage that holds its block)" if cfg.sharding == "auto" else "chosen",
        )
    if cfg.sharding != "auto":
        return cfg.sharding, "chosen"
    state = table_params * STATE_BYTES_PER_PARAM
    limit = f"{AUTO_SHARD_MIN_BYTES / 2**30:g} GiB"
    if world == 1:
        return "replicated", "auto: one process"
    if state <= AUTO_SHARD_MIN_BYTES:
        return "replicated", (
            f"auto: the tables' replicated state ({state / 2**20:,.1f} MiB a rank: weights, gradients, "
            f"Adam's moments) is under {limit}"
        )
    return "1d", (f"auto: {world} ranks and {state / 2**30:,.2f} GiB of replicated table state a rank, over {limit}")


@dataclass(frozen=True)
class EngramDecisions:
    """What the plan decided for ``layers=[engram]``."""

    #: The tables' sharding, ``auto`` resolved: ``replicated``, ``1d`` or ``2d``.
    sharding: str = "replicated"
