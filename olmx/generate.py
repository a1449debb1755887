"""``olmx generate RUN_DIR --prompt TEXT``: a continuation from a checkpoint of any olmx model.

The run's saved configuration is resolved again for one process on this machine (the default
infra target with one process, no parallel plugins, the run's layers and precision), so the model is
built exactly as training builds it (:func:`olmx.worker.model.build_model`, then OLMo-core's
train module, which initialises and places it). The checkpoint (the newest that verifies
against its olmx manifest, or ``--step N``) is loaded into it with OLMo-core's
``load_model_and_optim_state`` (distributed checkpoints reshard: a run trained on many ranks,
FSDP or sharded Engram tables included, loads into the one process). Then tokens are drawn
one at a time: greedy at temperature 0 (deterministic), else softmax sampling at
``temperature`` over the smallest set of tokens whose probability reaches ``top_p``, from a
generator seeded with ``seed``. Each step runs the model over the whole window (at most
``data.seq_len`` tokens, the last ones): no KV cache, which keeps every olmx layer (Engram's
n-gram hashes, MoE routing) exactly as in training.

Nothing is written: not to the run directory, not anywhere else. Byte-level runs
(``data.tokenizer.name=bytes``) encode the prompt as UTF-8 bytes and decode the continuation
the same way (an incomplete character is shown as U+FFFD); runs with ``data.tokenizer.path``
encode and decode with that ``tokenizer.json`` (the ``tokenizers`` package).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError
from olmx.local_model import choose_checkpoint, load_model, one_process
from olmx.plan.resolve import local_plan

#: How the continuation is drawn.
GREEDY = 0.0


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How ``olmx generate`` draws tokens."""

    #: Tokens to add after the prompt (fewer if the end-of-document id comes first).
    max_new_tokens: int = 64
    #: Softmax temperature; 0 is greedy (the most likely token, deterministic).
    temperature: float = 1.0
    #: Nucleus sampling: draw from the smallest set of tokens whose probability reaches this.
    top_p: float = 1.0
    #: Seed of the sampling generator.
    seed: int = 0

    def check(self) -> None:
        """ConfigError naming the option for a value that cannot sample."""
        if self.max_new_tokens < 1:
            raise ConfigError("--max-new-tokens", f"must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError("--temperature", f"must be 0 (greedy) or more, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError("--top-p", f"must be in (0, 1], got {self.top_p}")


def _tokenizer(plan: Any) -> Any:
    """The run's ``tokenizers.Tokenizer`` (``data.tokenizer.path``), or None for a byte-level run."""
    tok = plan.run.data.tokenizer
    if tok.path:
        from olmx.data.encode import load_tokenizer

        return load_tokenizer(tok.path, field="data.tokenizer.path")
    if tok.name != "bytes":
        raise ConfigError(
            "data.tokenizer",
            f"the run was trained on {tok.name!r} token ids and names no tokenizer.json (data.tokenizer.path): "
            "olmx generate reads and writes text for byte-level runs and runs with a tokenizer file",
        )
    return None


def encode(plan: Any, prompt: str) -> list[int]:
    """The prompt's token ids: its UTF-8 bytes (byte-level runs), or the tokenizer's ids without
    its post-processing, after the beginning-of-document id where the run puts one before
    every document (as ``olmx data tokenize`` and ``data=text`` write documents)."""
    tokenizer = _tokenizer(plan)
    if tokenizer is None:
        ids = list(prompt.encode("utf-8"))
    else:
        bos = plan.run.data.tokenizer.bos_id
        ids = [bos] * (bos is not None) + tokenizer.encode(prompt, add_special_tokens=False).ids
    if not prompt:
        raise ConfigError("--prompt", "is empty")
    return ids


def decode(plan: Any, ids: list[int], *, prompt: list[int] | None = None) -> str:
    """Text of the ``ids`` (after the ``prompt`` ids): byte-level ids beyond the bytes (such as
    end-of-document) are dropped; with a tokenizer, prompt and ids are decoded together (special
    tokens skipped) and the prompt's own text cut off, so tokenizers that decode a token
    differently at the start of a text (SentencePiece's leading space) continue correctly."""
    tokenizer = _tokenizer(plan)
    if tokenizer is None:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    head = tokenizer.decode(prompt or [])
    whole = tokenizer.decode((prompt or []) + ids)
    return whole[len(head) :] if whole.startswith(head) else tokenizer.decode(ids)


def generate(run_dir: str | Path, prompt: str, sampling: Sampling, *, step: int | None = None) -> tuple[str, int]:
    """``(continuation, checkpoint step)`` of ``prompt`` (see the module docstring)."""
    sampling.check()
    import logging

    logging.getLogger("olmo_core").setLevel(logging.ERROR)  # import-time notes (no transformer_engine, ...)
    from olmx.registry import registry

    reg = registry()
    plan = local_plan(run_dir, reg)
    ids = encode(plan, prompt)
    ckpt = choose_checkpoint(run_dir, step)
    from olmx.worker.checkpoint import verify

    problem = verify(ckpt)
    if problem:
        raise ConfigError("--step", f"{ckpt} does not verify against its manifest: {problem}")
    with one_process(plan):
        model = load_model(plan, reg, ckpt)
        out = sample(model, ids, sampling, window=plan.batch.seq_len, eos_id=plan.run.data.tokenizer.eos_id, plan=plan)
    return decode(plan, out, prompt=ids), int(ckpt.name[4:])


def sample(model: Any, ids: list[int], sampling: Sampling, *, window: int, eos_id: int | None, plan: Any) -> list[int]:
    """New token ids after ``ids``, drawn from ``model`` as :class:`Sampling` says."""
    import torch

    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(sampling.seed)
    tokens = list(ids)
    new: list[int] = []
    dtype = getattr(torch, plan.dtypes.param)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    model.eval()
    with torch.no_grad(), autocast:
        for _ in range(sampling.max_new_tokens):
            x = torch.tensor([tokens[-window:]], device=device)
            logits = model(x)[0, -1].float().cpu()
            logits = logits[: plan.run.data.tokenizer.vocab_size]  # padded ids never come out
            if sampling.temperature == GREEDY:
                nxt = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits / sampling.temperature, dim=-1)
                if sampling.top_p < 1:
                    sorted_p, order = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p  # the first always stays
                    probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
                nxt = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
            if nxt == eos_id:
                break
            tokens.append(nxt)
            new.append(nxt)
    return new
