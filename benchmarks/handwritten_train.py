"""The default tiny ``olmx train`` run, written by hand against OLMo-core 3.0.0: the baseline
of ``benchmarks/step_time.py``.

Builds, without olmx, the same objects ``olmx run`` builds for ``olmx train`` with its
defaults (``model=tiny data=stdlib parallel=[ddp] precision=fp32``): the llama-like
``TransformerConfig``, the ``TransformerTrainModuleConfig`` (OLMo-core's ``SkipStepAdamW``,
cosine schedule with warm-up, gradient clipping, DDP), the ``NumpyFSLDataset`` over the byte-level stdlib token
file, the ``NumpyDataLoaderConfig`` and the ``TrainerConfig`` with the same callbacks
(synchronous checkpointer, console logger). The only addition is :class:`StepTimer`, which
records on rank 0, per logged step, the wall clock (``time.time()``) in ``log_metrics`` —
the same hook and clock as the ``time`` field of olmx's ``metrics.jsonl`` — plus
``perf_counter`` at ``post_step`` and the step's loss, into ``RUN_DIR/timing.jsonl``.

Run it under torchrun, as olmx does::

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --max-restarts=0 --standalone \\
        benchmarks/handwritten_train.py --run-dir /tmp/hand --steps 60 [--data TOKENS.npy]

Without ``--data`` the token file comes from ``olmx.data.files.token_files`` (the cached
stdlib tokens ``olmx train`` uses; the only olmx call in this script).

``--olmo3-1b`` (a CUDA GPU; ``benchmarks/gpu/smoke.py`` runs it beside ``olmx train
model=olmo3_1b parallel=[fsdp]`` with the same batch) trains instead OLMo-core's own
``TransformerConfig.olmo3_1B`` set up as OLMo-core's OLMo 3 training scripts set it up (their
data mixes are remote, so the tokens stay the stdlib ones): flash-attention 2 where installed,
FSDP with bfloat16 parameters and float32 reductions, ``torch.compile``, ``SkipStepAdamW``
(lr 4e-4, weight decay 0.1 except on the embeddings, betas 0.9/0.95), clipping at 1.0, metrics
collected every 10 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

# What `olmx run` sets before anything else (olmx/worker/run.py).
os.environ.setdefault("OLMO_DISABLE_PER_RANK_TRITON_CACHE", "1")
os.environ.setdefault("OLMO_SHARED_FS", "1")

import torch  # noqa: E402
from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig  # noqa: E402
from olmo_core.distributed.parallel import DataParallelType  # noqa: E402
from olmo_core.distributed.utils import barrier, get_rank  # noqa: E402
from olmo_core.nn.attention import AttentionBackendName  # noqa: E402
from olmo_core.nn.feed_forward import FeedForwardConfig  # noqa: E402
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig  # noqa: E402
from olmo_core.optim import CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig  # noqa: E402
from olmo_core.train import (  # noqa: E402
    Duration,
    LoadStrategy,
    TrainerConfig,
    prepare_training_environment,
    teardown_training_environment,
)
from olmo_core.train.callbacks import Callback, CheckpointerCallback, ConsoleLoggerCallback  # noqa: E402
from olmo_core.train.train_module import (  # noqa: E402
    TransformerDataParallelConfig,
    TransformerTrainModuleConfig,
)

# The default run (conf/model/tiny.yaml, conf/data/stdlib.yaml, olmx/config/schema.py).
SEQ_LEN = 256
GLOBAL_SEQS = 16
MICRO_SEQS = 8
SEED = 42
VOCAB, EOS, PAD = 258, 256, 257
PADDED_VOCAB = 384  # 258 rounded up to a multiple of 128


@dataclass
class StepTimer(Callback):
    """Rank 0: per logged step, ``time.time()`` in ``log_metrics`` (as olmx's metrics.jsonl),
    the last ``perf_counter()`` taken at ``post_step``, and the CE loss."""

    path: str = ""
    _post_step: dict[int, float] = field(default_factory=dict, repr=False)

    def post_step(self) -> None:
        """Clock the end of the step."""
        self._post_step[self.step] = time.perf_counter()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Append the step's record (rank 0 only)."""
        if get_rank() != 0 or "train/CE loss" not in metrics:
            return
        record = {
            "step": step,
            "loss": metrics["train/CE loss"],
            "time": time.time(),
            "post_step_perf": self._post_step.get(step),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def default_token_file() -> str:
    """The stdlib token file of ``olmx train``'s default run."""
    from olmx.config.schema import DataConfig
    from olmx.data.files import token_files

    return token_files(DataConfig())[0]


def main() -> None:
    """Train the default tiny run for ``--steps`` steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-interval", type=int, default=1000)
    parser.add_argument("--data", default=None, help="token file (default: olmx's cached stdlib tokens)")
    parser.add_argument("--olmo3-1b", action="store_true", help="OLMo-core's OLMo 3 1B, as its scripts (CUDA)")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--global-seqs", type=int, default=GLOBAL_SEQS)
    parser.add_argument("--micro-seqs", type=int, default=MICRO_SEQS)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    run_dir = Path(args.run_dir).absolute()
    data_path = args.data or default_token_file()

    # One core per process on CPU, as olmx/worker/run.py does.
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = max(1, (os.cpu_count() or 1) // procs)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)

    big = args.olmo3_1b
    seq_len = args.seq_len
    prepare_training_environment(seed=SEED, backend="cpu:gloo,cuda:nccl" if big else "gloo", shared_filesystem=True)
    try:
        if get_rank() == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "timing.jsonl").unlink(missing_ok=True)
        barrier()

        if big:
            import importlib.util

            from olmo_core.config import DType

            flash = importlib.util.find_spec("flash_attn") is not None
            model_config = TransformerConfig.olmo3_1B(
                vocab_size=PADDED_VOCAB,
                attn_backend=AttentionBackendName.flash_2 if flash else AttentionBackendName.torch,
                init_seed=SEED,  # as olmx's trainer.seed
            )
            dp = TransformerDataParallelConfig(
                name=DataParallelType.fsdp, param_dtype=DType.bfloat16, reduce_dtype=DType.float32
            )
            lr, collect = 4e-4, 10
        model = (
            model_config.build(init_device="meta")
            if big
            else TransformerConfig.llama_like(
                d_model=128,
                vocab_size=PADDED_VOCAB,
                n_layers=4,
                n_heads=4,
                n_kv_heads=None,
                qk_norm=False,
                layer_norm_eps=1e-5,
                rope_theta=500_000,
                block_name=TransformerBlockType.default,
                attn_backend=AttentionBackendName.torch,
                sliding_window=None,
                feed_forward=FeedForwardConfig(hidden_size=512, bias=False),
                init_std=0.02,
                init_seed=SEED,  # olmx seeds the initial weights with trainer.seed
            ).build(init_device="meta")
        )

        train_module = TransformerTrainModuleConfig(
            rank_microbatch_size=args.micro_seqs * seq_len,
            max_sequence_length=seq_len,
            # no weight decay on the embeddings, as OLMo-core's OLMo 2/3 scripts (and olmx's default)
            optim=SkipStepAdamWConfig(
                lr=lr if big else 3e-3,
                betas=(0.9, 0.95),
                weight_decay=0.1,
                group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
            ),
            scheduler=CosWithWarmup(warmup=args.warmup),
            max_grad_norm=1.0,
            z_loss_multiplier=None,
            compile_model=big,
            dp_config=dp if big else TransformerDataParallelConfig(name=DataParallelType.ddp),
        ).build(model)

        tokenizer = TokenizerConfig(
            vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None, identifier="bytes"
        )
        dataset = NumpyFSLDatasetConfig(
            tokenizer=tokenizer, paths=[data_path], sequence_length=seq_len, work_dir=str(run_dir / "work" / "dataset")
        ).build()
        data_loader = NumpyDataLoaderConfig(
            global_batch_size=args.global_seqs * seq_len,
            seed=SEED,
            num_workers=0,
            work_dir=str(run_dir / "work" / "loader"),
        ).build(dataset, dp_process_group=train_module.dp_process_group)

        trainer = TrainerConfig(
            save_folder=str(run_dir / "checkpoints"),
            work_dir=str(run_dir / "work"),
            load_strategy=LoadStrategy.if_available,
            save_overwrite=True,
            max_duration=Duration.steps(args.steps),
            metrics_collect_interval=collect if big else 1,
            cancel_check_interval=10,
            callbacks={
                "checkpointer": CheckpointerCallback(
                    save_interval=args.save_interval, save_async=False, pre_train_checkpoint=False
                ),
                "console_logger": ConsoleLoggerCallback(log_interval=10),
                "step_timer": StepTimer(path=str(run_dir / "timing.jsonl")),
            },
        ).build(train_module, data_loader)
        trainer.fit()
    finally:
        teardown_training_environment()


if __name__ == "__main__":
    main()
