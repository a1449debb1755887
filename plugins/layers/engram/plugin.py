"""Engram: DeepSeek's hashed n-gram conditional memory before attention in chosen blocks.

Faithful to the official ``engram_demo_v1.py`` (tokenizer compression, multi-head n-gram
hashing with per-layer primes, gated value + dilated causal convolution); tables replicated
or sharded over ranks (``1d``/``2d``) with only the looked-up rows exchanged, in the compute
dtype. ``sharding=auto`` (the default) shards ``1d`` where there is more than one rank and the
tables are large (:func:`~.config.choose_sharding`); :meth:`EngramLayer.resolve` records the
choice as the plan's decision. It never picks ``2d``: that trades memory (1/``shard_degree``
instead of 1/world) for all-to-alls within a node, a choice of the user's.

One config: :class:`~.config.EngramLayerConfig` (``layers.engram``), validated here in
:meth:`EngramLayer.resolve` and nowhere else; the OLMo-core-side ``EngramConfig`` and
``EngramBlockConfig`` are derived from it at build (:meth:`EngramLayer.engram_config`).
"""

from __future__ import annotations

import os
from typing import Any

from olmx.api import Context, Contribution, LayerPlugin, LinearLayer
from olmx.errors import ConfigError
from olmx_plugins.layers.engram.config import (
    EngramDecisions,
    EngramLayerConfig,
    choose_sharding,
    layer_ids,
    table_init_std,
    table_state_bytes_per_rank,
    vocab_sizes,
)

#: Why Engram's projections stay in high precision under low-precision plugins (plan rows).
PROJECTION_KEEP = "Engram projections of the hashed table lookups (sparse, outlier-prone rows)"


def compression_tokens(cfg: EngramLayerConfig, tok: Any) -> list[tuple[str | None, str]]:
    """The token table that the canonical-id map is built from: one entry per real id of the
    run's tokenizer (``data.tokenizer``), never the model's vocabulary padding; with
    ``compression=false`` every real id is its own key. Torch-free (the plan counts ``V'``);
    ``OSError``/``ValueError``/``KeyError`` for an unreadable ``tokenizer.json``."""
    from olmx_plugins.layers.engram.compression import byte_level_tokens, tokenizer_json_tokens

    if not cfg.compression:
        return [(None, f"<|id_{i}|>") for i in range(tok.vocab_size)]
    if tok.name == "bytes":
        named = {tok.eos_id: "<|endoftext|>", tok.pad_id: "<|pad|>"}
        if tok.bos_id is not None:
            named[tok.bos_id] = "<|bos|>"
        return byte_level_tokens(vocab_size=tok.vocab_size, special_tokens=named)
    return tokenizer_json_tokens(os.path.expanduser(tok.path))


class EngramLayer(LayerPlugin):
    """Adds Engram blocks through OLMo-core named blocks; hashes once per batch."""

    name = "engram"
    api = ">=3.0,<4"
    Config = EngramLayerConfig
    Decisions = EngramDecisions
    #: Extends whatever block is there: after plugins that replace blocks (order < 90).
    order = 90
    #: An Engram block and its (replicated) tables sit on the stage that holds the block, which
    #: hashes the micro-batch's token ids (:data:`olmx.api.PIPELINE_TOKEN_IDS`).
    pipeline_parallel = True

    def resolve(self, cfg: EngramLayerConfig, ctx: Context) -> Contribution:
        """Check what joins the settings (each field's own rule is checked before); table sizes, parameters and
        lookup traffic for the plan."""
        from olmx_plugins.layers.engram.primes import ngram_table_sizes

        run, world = ctx.run, ctx.world
        m, vocab = run.model, ctx.vocab_size
        ids = layer_ids(cfg, m.n_layers)
        if not ids:
            raise ConfigError("layers.engram.layer_ids", "must name at least one block")
        bad = [i for i in ids if not 0 <= i < m.n_layers]
        if bad:
            raise ConfigError("layers.engram.layer_ids", f"{bad} outside [0, model.n_layers={m.n_layers})")
        if len(set(ids)) != len(ids):
            raise ConfigError("layers.engram.layer_ids", f"{ids} has duplicates")
        sizes_cfg = vocab_sizes(cfg, vocab)
        if len(sizes_cfg) != cfg.max_ngram_size - 1:
            raise ConfigError(
                "layers.engram.vocab_size_per_ngram",
                f"needs {cfg.max_ngram_size - 1} entries (orders 2..{cfg.max_ngram_size}), got {len(sizes_cfg)}",
            )
        if cfg.sharding == "2d" and (not cfg.shard_degree or world.size % cfg.shard_degree):
            raise ConfigError(
                "layers.engram.shard_degree",
                f"sharding=2d needs a shard_degree dividing the world size {world.size}, got {cfg.shard_degree}",
            )
        tok = run.data.tokenizer
        if cfg.compression and tok.name != "bytes" and not tok.path:
            raise ConfigError(
                "layers.engram.compression",
                f"compression needs the vocabulary of tokenizer "
                f"'{tok.name}': set data.tokenizer.path to its local tokenizer.json (olmx "
                "downloads nothing), or layers.engram.compression=false to hash raw ids",
            )
        from olmx_plugins.layers.engram.compression import canonical_ids

        try:
            token_table = compression_tokens(cfg, tok)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                "data.tokenizer.path", f"cannot read the tokenizer for Engram's compression: {exc}"
            ) from None
        if len(token_table) > tok.vocab_size:
            raise ConfigError(
                "data.tokenizer.path",
                f"{tok.path} defines {len(token_table):,} token ids, more than data.tokenizer.vocab_size="
                f"{tok.vocab_size:,}: a different tokenizer, or set vocab_size to {len(token_table):,}",
            )
        _, compressed = canonical_ids(token_table)
        if ctx.mesh.shards_sequence:
            # Each rank's convolution reads the previous sequence shard's last positions.
            halo, shard = (cfg.kernel_size - 1) * cfg.max_ngram_size, run.data.seq_len // ctx.mesh.cp
            if halo > shard:
                raise ConfigError(
                    "layers.engram.kernel_size",
                    f"the convolution reaches (kernel_size - 1) x max_ngram_size = {halo} positions "
                    f"back, more than one sequence shard (data.seq_len / context-parallel degree "
                    f"{ctx.mesh.cp} = {shard} tokens)",
                )
        tables = ngram_table_sizes(
            layer_ids=ids,
            max_ngram_size=cfg.max_ngram_size,
            n_head_per_ngram=cfg.n_head_per_ngram,
            vocab_size_per_ngram=sizes_cfg,
        )
        dim = cfg.n_embed_per_ngram // cfg.n_head_per_ngram
        d_mem = (cfg.max_ngram_size - 1) * cfg.n_embed_per_ngram
        dense = 2 * (d_mem * m.d_model + m.d_model) + 3 * m.d_model + cfg.kernel_size * m.d_model
        table_params = sum(sum(s) * dim for s in tables.values())
        heads = (cfg.max_ngram_size - 1) * cfg.n_head_per_ngram
        tokens = run.trainer.global_batch_size * run.data.seq_len
        lookups = tokens * heads * len(ids)
        sharding, why = choose_sharding(cfg, world=world.size, table_params=table_params, pipeline=ctx.mesh.pp > 1)
        state = table_state_bytes_per_rank(
            [sum(s) for s in tables.values()],
            dim,
            sharding=sharding,
            world=world.size,
            shard_degree=cfg.shard_degree,
            fsdp_shard=ctx.mesh.dp_shard if ctx.mesh.shards_params else 1,
        )
        wire = ctx.dtypes.compute_bytes
        rows = [
            ("Engram blocks", f"{ids} of {m.n_layers}"),
            (
                "tables",
                "; ".join(
                    f"block {layer}: {heads} heads, {sum(s):,} rows x {dim}, {sum(s) * dim:,} params, "
                    f"{sum(s) * dim * 4 / 2**20:,.1f} MiB fp32"
                    for layer, s in tables.items()
                ),
            ),
            ("lookups per step", f"{lookups:,} rows = {lookups * dim * 4 / 2**20:,.1f} MiB gathered"),
            (
                "sharding",
                f"{sharding} ({why})"
                + (
                    ""
                    if sharding == "replicated"
                    else f": only looked-up rows cross ranks, in {ctx.dtypes.param} (<= "
                    f"{lookups * dim * wire * 2 / 2**20:,.1f} MiB per step, forward + backward)"
                ),
            ),
            (
                "table state per rank",
                (f"{state / 2**30:,.2f} GiB" if state >= 2**30 else f"{state / 2**20:,.1f} MiB")
                + " (fp32 weights, gradients, Adam's 2 moments)"
                + (
                    "; FSDP gathers each whole table and makes its whole gradient at each use"
                    if sharding == "replicated" and ctx.mesh.shards_params and world.size > 1
                    else ""
                )
                + ("; on a stage that holds every Engram block (the others hold less)" if ctx.mesh.pp > 1 else ""),
            ),
            ("optimizer", self._optimizer_row(cfg, run.trainer)),
            (
                "tokenizer compression",
                "off: raw ids are hashed"
                if not cfg.compression
                else "byte-level tokenizer"
                if tok.name == "bytes"
                else f"{tok.name} vocabulary from {tok.path}",
            ),
            (
                "canonical ids V'",
                f"{compressed:,} of the tokenizer's {len(token_table):,} ids (model vocabulary {vocab:,})",
            ),
            ("table init std", f"{table_init_std(cfg, m.init_std):g}"),
        ]
        n = len(ids)
        return Contribution(
            rows=rows,
            params=table_params + n * dense,
            active_params=n * (dense + heads * dim),
            sharded_params=0 if sharding == "replicated" else table_params,
            sharded_over=world.size if sharding == "1d" else (cfg.shard_degree or 1),
            # per Engram block and token: the gathered rows (d_mem) and about 11 d-wide tensors
            # (projections, the three norms, gate, convolution); full checkpointing recomputes them
            activation_bytes_per_token=0
            if run.trainer.activation_checkpointing == "full"
            else n * (d_mem + 11 * m.d_model) * wire,
            decisions=EngramDecisions(sharding=sharding),
        )

    @staticmethod
    def _optimizer_row(cfg: EngramLayerConfig, trainer: Any) -> str:
        wd = trainer.weight_decay if cfg.non_matrix_weight_decay is None else cfg.non_matrix_weight_decay
        return (
            f"tables: lr x {cfg.table_lr_multiplier:g}, weight decay {cfg.table_weight_decay:g}; conv, norm "
            f"gains, biases: weight decay {wd:g}; projections: the backbone's"
        )

    def sharding(self, cfg: EngramLayerConfig, plan: Any) -> str:
        """The tables' sharding the plan decided (``auto`` resolved by :meth:`resolve`)."""
        decided = self.decided(plan)
        if isinstance(decided, EngramDecisions):
            return decided.sharding
        return "replicated" if cfg.sharding == "auto" else cfg.sharding

    def engram_config(self, cfg: EngramLayerConfig, plan: Any) -> Any:
        """The blocks' OLMo-core-side ``EngramConfig``, derived from ``cfg`` (validated by
        :meth:`resolve`): the block indices and table sizes resolved against the plan's model
        and vocabulary."""
        from olmx_plugins.layers.engram.block import EngramConfig
        from olmx_plugins.layers.engram.sharding import TableSharding

        return EngramConfig(
            layer_ids=layer_ids(cfg, plan.run.model.n_layers),
            max_ngram_size=cfg.max_ngram_size,
            n_head_per_ngram=cfg.n_head_per_ngram,
            n_embed_per_ngram=cfg.n_embed_per_ngram,
            vocab_size_per_ngram=vocab_sizes(cfg, plan.vocab_size),
            kernel_size=cfg.kernel_size,
            seed=cfg.seed,
            zero_init_conv=cfg.zero_init_conv,
            table_init_std=table_init_std(cfg, plan.run.model.init_std),
            sharding=TableSharding(self.sharding(cfg, plan)),
            shard_degree=cfg.shard_degree,
        )

    def linear_layers(self, cfg: EngramLayerConfig, ctx: Context, layers: list[LinearLayer]) -> list[LinearLayer]:
        """The model's ``nn.Linear`` layers (:mod:`olmx.plan.linears`) plus each Engram
        block's key and value projections (from the concatenated lookups to ``d_model``)."""
        width = (cfg.max_ngram_size - 1) * cfg.n_embed_per_ngram
        m = ctx.run.model
        return layers + [
            # an nn.Linear subclass (module._Projection: its own bias initialisation)
            LinearLayer(f"blocks.{i}.engram.{w}", width, m.d_model, keep=PROJECTION_KEEP, subclass=True)
            for i in layer_ids(cfg, m.n_layers)
            for w in ("key_proj", "value_proj")
        ]

    def apply_model_config(self, cfg: EngramLayerConfig, model_config: Any, plan: Any) -> Any:
        """Extend the block of every Engram index, whatever its kind (another layer plugin's
        too, e.g. the portable MoE block): named blocks (``engram`` for ``dense``,
        ``engram_<name>`` for the others) with an exact per-layer ``block_pattern``, or, where
        the blocks are placed by ``block_overrides``, overrides."""
        from dataclasses import replace

        from olmx_plugins.layers.engram.block import EngramBlockConfig

        ecfg = self.engram_config(cfg, plan)
        if model_config.block_overrides:  # OLMo-core allows them only with a single block
            overrides = dict(model_config.block_overrides)
            for i in ecfg.layer_ids:
                overrides[i] = EngramBlockConfig.extending(overrides.get(i, model_config.block), engram=ecfg)
            return replace(model_config, block_overrides=overrides)
        named = isinstance(model_config.block, dict)
        blocks = dict(model_config.block) if named else {"dense": model_config.block}
        cycle = model_config.block_pattern if named else ["dense"]
        pattern = [cycle[i % len(cycle)] for i in range(model_config.n_layers)]
        for i in ecfg.layer_ids:
            name = "engram" if pattern[i] == "dense" else f"engram_{pattern[i]}"
            if name not in blocks:
                blocks[name] = EngramBlockConfig.extending(blocks[pattern[i]], engram=ecfg)
            pattern[i] = name
        return replace(model_config, block=blocks, block_pattern=pattern)

    def apply_model(self, cfg: EngramLayerConfig, model: Any, plan: Any) -> None:
        """Hash once per batch for all Engram blocks (before any parallel wrapper)."""
        from olmx_plugins.layers.engram.block import apply_engram_inputs
        from olmx_plugins.layers.engram.compression import TokenizerCompression

        tok = plan.run.data.tokenizer
        comp = TokenizerCompression(compression_tokens(cfg, tok), vocab_size=plan.vocab_size)
        hasher = self.engram_config(cfg, plan).build_hasher(
            pad_id=comp.canonical(tok.pad_id), compressed_vocab_size=comp.compressed_vocab_size
        )
        apply_engram_inputs(model, compression=comp, hasher=hasher)

    def apply_train_module(
        self, cfg: EngramLayerConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]
    ) -> Any:
        """Optimizer groups. The paper (§4.1, as transcribed) trains the tables with Adam at 5x
        the learning rate and no weight decay, and the backbone with Muon; it says nothing of
        Engram's other parameters. So: the tables in their own group (``table_lr_multiplier``,
        ``table_weight_decay``); the key/value matrices with the backbone's (they are backbone
        matrices, Muon's there); the convolution kernel, norm gains and biases with the
        backbone's learning rate and ``non_matrix_weight_decay`` (null: the backbone's, as its own
        norm gains). The core's clipping takes the global norm across meshes, sharded tables
        included."""
        from olmo_core.optim import OptimGroupOverride

        from olmx_plugins.layers.engram.block import NON_MATRIX_PARAM_PATTERNS, TABLE_PARAM_PATTERN

        optim = train_module.optim
        overrides = [
            OptimGroupOverride(
                params=[TABLE_PARAM_PATTERN],
                opts={"lr": optim.lr * cfg.table_lr_multiplier, "weight_decay": cfg.table_weight_decay},
            )
        ]
        if cfg.non_matrix_weight_decay is not None:
            overrides.append(
                OptimGroupOverride(
                    params=list(NON_MATRIX_PARAM_PATTERNS), opts={"weight_decay": cfg.non_matrix_weight_decay}
                )
            )
        optim.group_overrides = [*(optim.group_overrides or []), *overrides]
        return train_module


ENGRAM = EngramLayer()
