"""``olmx export hf|torch RUN_DIR --out PATH``: a checkpoint of a run as files other tools read.

The checkpoint (the newest that verifies against its olmx manifest, or ``--step N``) is loaded
into the run's model in one process on this machine, as ``olmx generate`` loads it
(:mod:`olmx.local_model`: distributed checkpoints reshard, whatever the run's world was).

* ``hf``: a Hugging Face ``transformers`` directory (``config.json``, ``generation_config.json``,
  ``model.safetensors`` in the trained float32 weights) that ``AutoModelForCausalLM.from_pretrained``
  loads, converted by OLMo-core's ``olmo_core.nn.hf``; the architecture is Llama, OLMo 2 or
  OLMo 3, or with MoE layers OLMoE or FlexOlmo (:func:`olmx.plan.hf.hf_export_class` says which
  model is which, in the plan too; the others are refused with the reason and the setting that
  would do, before anything is loaded). The embeddings keep the model's padded vocabulary
  (a multiple of 128), so the logits are the model's. A byte-level run gets a byte-level
  ``tokenizer.json`` (ids 0-255 are the UTF-8 bytes, its special ids named) that
  ``AutoTokenizer`` reads as olmx encodes; a run whose
  ``data.tokenizer.path`` names a local ``tokenizer.json`` gets it with a ``tokenizer_config.json``
  (the run's special ids), written and reloaded by OLMo-core's tokenizer export, so that
  ``AutoTokenizer.from_pretrained`` loads the directory.
* ``torch``: one file, ``torch.save`` of the full, unsharded state dict (OLMo-core parameter
  names -> CPU tensors; ``torch.load(FILE, weights_only=True)``), for any model, Engram and
  MoE included.

Export never overwrites: ``--out`` must not exist (``hf``: or be an empty directory); its
folders that do not exist yet are made. The
files are written beside it under a temporary name and renamed into place when complete; the
partial copy of an export that was killed is removed by the next export to the same ``--out``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError
from olmx.writable import check_writable


@dataclasses.dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    #: The directory or file written.
    path: Path
    #: The checkpoint step exported.
    step: int
    #: Number of tensors written.
    tensors: int
    #: ``hf``: the transformers class (``Olmo2ForCausalLM``); ``torch``: empty.
    architecture: str = ""
    #: ``hf``: what became of the tokenizer.
    tokenizer: str = ""


def _check_out(out: Path, *, directory: bool) -> Path:
    """``out`` absolute, where nothing would be overwritten."""
    out = Path(os.path.expanduser(out)).absolute()
    what = "directory" if directory else "file"
    if out.is_symlink():  # followed, the export would land elsewhere (and the rename fail)
        raise ConfigError("--out", f"{out} is a symbolic link: export writes a new {what}; give a real path")
    if out.is_dir() and directory:
        if any(out.iterdir()):
            raise ConfigError("--out", f"{out} exists and is not empty: export writes a new {what}, never over files")
    elif out.exists() or out.is_symlink():
        raise ConfigError("--out", f"{out} exists: export writes a new {what}, it never overwrites")
    check_writable(out.parent, "--out")  # its folders that do not exist yet are made when it is written
    return out


def _temporary(out: Path) -> Path:
    """Where the export is written before it is renamed to ``out``: ``.OUT.olmx-export-PID``
    beside it (``out``'s folders made where they do not exist yet). Those of exports that were
    killed (their process is gone) are removed first: olmx named them, and a killed export leaves
    its partial copy nowhere else."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"\.{re.escape(out.name)}\.olmx-export-(\d+)")
    for path in out.parent.iterdir():
        m = stale.fullmatch(path.name)
        if m and not _alive(int(m.group(1))):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    return out.with_name(f".{out.name}.olmx-export-{os.getpid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _tokenizer_file(plan: Any) -> Path | None:
    """The run's local ``tokenizer.json`` (None: byte-level, or no file named)."""
    tok = plan.run.data.tokenizer
    if tok.name == "bytes" or not tok.path:
        return None
    path = Path(os.path.expanduser(tok.path))
    if not path.is_file():
        raise ConfigError("data.tokenizer.path", f"'{tok.path}' is not a file (the run's tokenizer.json, to copy)")
    return path


def export_hf(run_dir: str | Path, out: str | Path, *, step: int | None = None) -> Exported:
    """Write the run's checkpoint as a Hugging Face ``transformers`` directory ``out`` (see the
    module docstring)."""
    out = _check_out(Path(out), directory=True)
    reg, plan = _plan(run_dir)
    cls, checkpoint = _hf_target(plan, reg)  # refused before anything is loaded
    tokenizer = _tokenizer_file(plan)
    from olmx.local_model import verified_checkpoint
    from olmx.worker.hf import offline

    ckpt = verified_checkpoint(run_dir, step)
    offline()
    tmp = _temporary(out)
    try:
        n = _with_model(plan, reg, ckpt, lambda model: _save_hf(model, plan, cls, checkpoint, tmp))
        tok = plan.run.data.tokenizer
        if tokenizer is not None:
            note = _save_tokenizer(plan, tokenizer, tmp)
        elif tok.name == "bytes":
            note = _save_byte_tokenizer(plan, tmp)
        else:
            note = f"no tokenizer files: the run names no local tokenizer.json of {tok.name!r} (data.tokenizer.path)"
        if out.is_dir():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Exported(path=out, step=int(ckpt.name[4:]), tensors=n, architecture=cls, tokenizer=note)


def _hf_target(plan: Any, reg: Any) -> tuple[str, Any]:
    """The ``transformers`` class of the run's model (:func:`olmx.plan.hf.hf_export_class`, the
    plan's row's source too) and the function that makes its config and state from the built
    model: a dense model's, or the layer plugin's that named the class."""
    from olmx.plan.hf import hf_architecture, hf_export_class

    cls = hf_export_class(plan.run, reg)
    if not plan.run.layers:
        arch = hf_architecture(plan.run)

        def dense(model: Any) -> tuple[Any, dict[str, Any]]:
            from olmx.worker.hf import dense_checkpoint

            return dense_checkpoint(model, plan, arch)

        return cls, dense
    ((name, cfg),) = plan.run.layers.items()
    plugin = reg.get("layer", name)
    return cls, lambda model: plugin.hf_checkpoint(cfg, model, plan)


def export_torch(run_dir: str | Path, out: str | Path, *, step: int | None = None) -> Exported:
    """Write the run's checkpoint as one ``torch.save`` file of its full state dict."""
    out = _check_out(Path(out), directory=False)
    reg, plan = _plan(run_dir)
    from olmx.local_model import verified_checkpoint

    ckpt = verified_checkpoint(run_dir, step)
    tmp = _temporary(out)
    try:
        n = _with_model(plan, reg, ckpt, lambda model: _save_torch(model, tmp))
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(path=out, step=int(ckpt.name[4:]), tensors=n)


def _save_tokenizer(plan: Any, path: Path, out: Path) -> str:
    """The run's tokenizer as ``tokenizer.json`` plus ``tokenizer_config.json`` (its special
    tokens: the run's ids) in ``out``, written by OLMo-core's ``export_checkpoint_tokenizer``,
    which saves it through ``transformers`` and checks that ``AutoTokenizer.from_pretrained(out)``
    encodes and decodes exactly as the file does. Returns the note the command prints."""
    import tempfile

    from olmo_core.data import TokenizerConfig
    from olmo_core.nn.hf.tokenizer import export_checkpoint_tokenizer

    from olmx.data.tokenizer import read_tokenizer_json

    tok = plan.run.data.tokenizer
    facts = read_tokenizer_json(path)
    config = TokenizerConfig(
        vocab_size=facts.vocab_size,  # the tokenizer's own ids (the model's embeddings are padded)
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        bos_token_id=tok.bos_id,
        identifier=tok.name,
    )
    with tempfile.TemporaryDirectory() as scratch:
        source = path.parent
        if path.name != "tokenizer.json":  # OLMo-core reads a folder's tokenizer.json
            source = Path(scratch)
            shutil.copyfile(path, source / "tokenizer.json")
        try:
            export_checkpoint_tokenizer(None, out, config, override=str(source))
        except ValueError as exc:
            raise ConfigError("data.tokenizer.path", f"OLMo-core's tokenizer export refused {path}: {exc}") from None
    return f"tokenizer.json and tokenizer_config.json from {path} (transformers.AutoTokenizer loads them)"


#: The names of a byte-level run's special ids in its exported tokenizer.
BYTE_SPECIALS = {"eos_id": "<|endoftext|>", "pad_id": "<|pad|>", "bos_id": "<|bos|>"}


def _save_byte_tokenizer(plan: Any, out: Path) -> str:
    """A byte-level run's tokenizer as ``tokenizer.json`` plus ``tokenizer_config.json``:
    byte-level BPE without merges (GPT-2's byte alphabet, each byte's id its value), so that
    ``AutoTokenizer.from_pretrained`` encodes text to its UTF-8 bytes exactly as olmx does, with
    the run's end-of-document (and padding, beginning) ids as special tokens. Without it
    ``transformers`` makes an empty tokenizer for the directory's model type. Returns the note."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = plan.run.data.tokenizer
    alphabet = _byte_alphabet()
    specials = {name: getattr(tok, key) for key, name in BYTE_SPECIALS.items() if getattr(tok, key) is not None}
    vocab = {alphabet[b]: b for b in range(256)} | {name: i for name, i in specials.items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in specials])
    tokenizer.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": plan.run.data.seq_len}
    config |= {key.removesuffix("_id") + "_token": name for key, name in BYTE_SPECIALS.items() if name in specials}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    ids = ", ".join(f"{name} {i}" for name, i in specials.items())
    return f"tokenizer.json: byte-level (ids 0-255 are UTF-8 bytes; {ids}), which transformers.AutoTokenizer loads"


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in of each byte (``bytes_to_unicode``), which byte-level BPE
    tokenizers keep in their vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


def _plan(run_dir: str | Path) -> tuple[Any, Any]:
    import logging

    logging.getLogger("olmo_core").setLevel(logging.ERROR)  # import-time notes (no transformer_engine, ...)
    from olmx.plan.resolve import local_plan
    from olmx.registry import registry

    reg = registry()
    return reg, local_plan(run_dir, reg)


def _with_model(plan: Any, reg: Any, ckpt: Path, write: Any) -> int:
    from olmx.local_model import load_model, one_process

    with one_process(plan):  # the architecture as configured: windows that training could skip too
        return write(load_model(plan, reg, ckpt, keep_windows=True))


def _save_hf(model: Any, plan: Any, cls: str, checkpoint: Any, tmp: Path) -> int:
    from olmx.worker.hf import write_hf

    config, state = checkpoint(model)
    return write_hf(config, state, plan, cls, model.vocab_size, tmp)


def _save_torch(model: Any, tmp: Path) -> int:
    import torch
    from olmo_core.distributed.utils import get_full_tensor

    state = {k: get_full_tensor(v).detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, tmp)
    return len(state)
