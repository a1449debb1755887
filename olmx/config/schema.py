"""The typed run configuration: the schema of ``conf/train.yaml``.

Every field's docstring is user documentation (``olmx train --help-config`` prints them).
Plugin sections (``layers``, ``parallel``, ``precision``, ``infra``) are typed by the
plugins' own ``Config`` dataclasses in :func:`olmx.config.compose.to_object`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ModelConfig:
    """An OLMo-core llama-like transformer. ``conf/model/`` holds presets that reproduce
    OLMo-core 3.0.0's ``TransformerConfig.olmo3_*`` exactly (a test checks this)."""

    #: Label of the architecture, shown in the plan.
    name: str = "tiny"
    #: Width of the residual stream.
    d_model: int = 128
    #: Number of transformer blocks.
    n_layers: int = 4
    #: Attention query heads.
    n_heads: int = 4
    #: Key/value heads (grouped-query attention); null means equal to ``n_heads``.
    n_kv_heads: Optional[int] = None
    #: Hidden width of the gated (SwiGLU) feed-forward network.
    hidden_size: int = 512
    #: OLMo-core block type: ``default`` (pre-norm) or ``reordered_norm`` (OLMo 2/3 post-norm).
    block: str = "default"
    #: RMS-normalise queries and keys (OLMo 2/3).
    qk_norm: bool = False
    #: RoPE base.
    rope_theta: int = 500_000
    #: Epsilon of every RMSNorm.
    layer_norm_eps: float = 1e-5
    #: Sliding-window pattern cycled over layers (-1 = full attention), as in OLMo 3;
    #: the last layer always attends fully. null disables sliding windows.
    sliding_window: Optional[list[int]] = None
    #: Attention kernel: ``auto`` (with 16-bit compute on CUDA: flash-attn 3 on SM90+ where
    #: installed, else flash-attn 2 where installed, else torch SDPA; torch SDPA otherwise),
    #: ``torch``, ``flash_2``, ``flash_3`` (flash-attn takes only 16-bit inputs: refused with
    #: float32 compute), ``te`` (TransformerEngine).
    attn_backend: str = "auto"
    #: Standard deviation of the normal initialisation.
    init_std: float = 0.02
    #: A local Hugging Face ``transformers`` checkpoint directory (``config.json`` plus
    #: safetensors weights, e.g. written by ``olmx export hf``) whose weights a fresh run starts
    #: from instead of the random initialisation; a resume loads its own checkpoint instead.
    #: Its architecture must be the one this model maps to (``default`` block: Llama;
    #: ``reordered_norm`` with QK-norm: OLMo 2, or OLMo 3 with sliding windows) and every tensor's
    #: shape must match: the plan checks both and says what it loads. Never downloaded.
    init_from: Optional[str] = None


@dataclass
class TokenizerConfig:
    """Token id facts of the data (no tokenizer is downloaded)."""

    #: ``bytes`` (olmx's byte-level tokenizer: ids 0-255 are bytes) or the name of the
    #: tokenizer that produced pre-tokenized data (e.g. ``dolma2``).
    name: str = "bytes"
    #: Number of token ids the tokenizer produces (the model pads it to a multiple of 128).
    #: It also chooses the dtype OLMo-core reads raw token files in: the smallest of uint8,
    #: uint16, uint32, uint64 that holds ``vocab_size - 1`` (byte-level data: 257-65,536).
    vocab_size: int = 258
    #: End-of-document id (byte-level data: >= 256, ids 0-255 are bytes).
    eos_id: int = 256
    #: Padding id.
    pad_id: int = 257
    #: Beginning-of-document id, if the tokenizer has one.
    bos_id: Optional[int] = None
    #: A local Hugging Face ``tokenizer.json`` of this tokenizer (byte-level BPE, e.g. dolma2's),
    #: for what needs its vocabulary (Engram's tokenizer compression). Never downloaded.
    path: Optional[str] = None


@dataclass
class DataConfig:
    """Where the training tokens come from."""

    #: ``stdlib`` (the ``.py`` files of the running Python's standard library), ``text``
    #: (your text files in ``paths``) or ``numpy`` (pre-tokenized OLMo-core token files).
    name: str = "stdlib"
    #: Input files or globs, each matched file read in the given order (a directory is refused:
    #: name its files, ``dir/*.npy``). ``text``: text files, tokenized byte-level. ``numpy``:
    #: OLMo-core token files: raw arrays of ids in the dtype ``data.tokenizer.vocab_size``
    #: chooses, or ``.npy`` files written by ``np.save`` (any integer dtype, C order), read
    #: through their header and copied once as raw ids into ``cache_dir``. The plan checks the
    #: sizes, headers and a sample of ids of every file, and that they hold one optimizer step.
    paths: list[str] = field(default_factory=list)
    #: Tokens per training sequence (at most 1,048,576). OLMo-core cuts each token file into
    #: whole sequences; one optimizer step takes ``trainer.global_batch_size`` of them.
    seq_len: int = 256
    #: Token id facts.
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    #: Where tokenized caches of ``stdlib``/``text`` and raw copies of ``np.save``'d ``numpy``
    #: files are written once and reused (default: ``$OLMX_CACHE_DIR`` or ``~/.cache/olmx``);
    #: it must be writable, checked at plan time.
    cache_dir: Optional[str] = None
    #: Data-loader worker processes per rank.
    num_workers: int = 0


@dataclass
class TrainerConfig:
    """Optimisation, duration, checkpoints and logging."""

    #: Optimizer steps to train for.
    max_steps: int = 200
    #: Stop after this step (a checkpoint is written there) without changing the schedule,
    #: which still runs to ``max_steps``: splits a run into pieces that resume where they stop.
    stop_at_step: Optional[int] = None
    #: Sequences per optimizer step, over the whole world.
    global_batch_size: int = 16
    #: Sequences per forward/backward pass on one process (gradients are accumulated
    #: when the global batch needs more).
    micro_batch_size: int = 8
    #: ``skip_step_adamw`` (OLMo-core's ``SkipStepAdamW``, as its OLMo 2/3 training scripts:
    #: AdamW that skips, on the device and without a host sync, a step whose loss or gradient
    #: norm is more than 6 standard deviations above the mean of the last 128 steps, once 64
    #: steps are known) or ``adamw`` (``torch.optim.AdamW``). Multi-tensor kernels on CUDA.
    optimizer: str = "skip_step_adamw"
    #: Peak learning rate.
    lr: float = 3e-3
    #: AdamW betas.
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    #: Decoupled weight decay.
    weight_decay: float = 0.1
    #: Apply the weight decay to the input embeddings too; false (the default) exempts them, as
    #: OLMo-core's OLMo 2/3 training scripts do.
    decay_embeddings: bool = False
    #: Linear warm-up steps.
    warmup_steps: int = 20
    #: Learning-rate schedule after warm-up: ``cosine`` (to 10% of the peak), ``linear``
    #: (to 0) or ``constant``.
    schedule: str = "cosine"
    #: Gradient clipping by global norm (null disables).
    max_grad_norm: Optional[float] = 1.0
    #: Z-loss multiplier (null disables).
    z_loss: Optional[float] = None
    #: Seed of initialisation and data order.
    seed: int = 42
    #: Run directory (checkpoints, metrics, logs, plan). Default: a new folder under
    #: ``runs_root``.
    run_dir: Optional[str] = None
    #: Parent of generated run directories.
    runs_root: str = "runs"
    #: Resume from the latest checkpoint in ``run_dir`` if there is one; false starts fresh.
    resume: bool = True
    #: Steps between checkpoints (a final checkpoint is always written).
    save_interval: int = 100
    #: Steps between metric records (loss, throughput) in ``metrics.jsonl``; collecting them
    #: syncs the host with the device. null: 10 on CUDA (as OLMo-core's own training scripts:
    #: 10-50), every step on CPUs.
    log_interval: Optional[int] = None
    #: Activation checkpointing: ``full`` (OLMo-core: every block), ``long_context`` (olmx:
    #: keep attention outputs, recompute feed-forward and norms), or null for none.
    activation_checkpointing: Optional[str] = None
    #: ``torch.compile`` the blocks: ``auto`` (on with CUDA, as OLMo-core's training scripts;
    #: off on CPUs, where inductor compiles slowly for little gain), ``true`` (CUDA only:
    #: OLMo-core 3.0.0 skips compiling where CUDA is missing) or ``false``.
    compile: str = "auto"
    #: What a non-finite (NaN/inf) loss or gradient does: ``stop`` saves a checkpoint of the
    #: last good parameters and stops (``olmx train`` exits with 76); ``skip`` skips that
    #: optimizer step, counts it in the summary and trains on.
    on_nonfinite: str = "stop"
    #: When ``olmx train`` ends (finished, stopped or failed), write the run's report
    #: (``RUN_DIR/report/``: summary table and plots, as ``olmx report RUN_DIR``) and say where.
    report: bool = True


@dataclass
class RunConfig:
    """A whole run: what ``conf/train.yaml`` composes to."""

    #: The transformer.
    model: ModelConfig = field(default_factory=ModelConfig)
    #: The training data.
    data: DataConfig = field(default_factory=DataConfig)
    #: Optimisation, duration, checkpoints.
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: Layer plugins by name (``layers=[engram,moe]``), each with its own settings.
    layers: dict[str, Any] = field(default_factory=dict)
    #: Parallel strategies by name (``parallel=[fsdp,ulysses]``); they compose.
    parallel: dict[str, Any] = field(default_factory=dict)
    #: The precision backend (exactly one, ``precision=bf16``), with its settings.
    precision: dict[str, Any] = field(default_factory=dict)
    #: The infra target (``infra=local``): its ``name`` plus its settings.
    infra: dict[str, Any] = field(default_factory=dict)
    #: Free-form values for your own callbacks and notes (``+extra.key=1``).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def infra_name(self) -> str:
        """Name of the selected infra plugin."""
        return next(iter(self.infra))

    @property
    def precision_name(self) -> str:
        """Name of the selected precision plugin."""
        return next(iter(self.precision))
