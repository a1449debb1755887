"""``data.tokenizer.path``: the token id facts of a Hugging Face ``tokenizer.json``, at plan time.

The file is read as JSON (no torch, no ``tokenizers`` package): its vocabulary size is the
largest id it defines plus one (the model vocabulary and the added tokens: ``len(tokenizer)``
for every real tokenizer, whose ids are contiguous). The special ids are found, in this order:

* a ``tokenizer_config.json`` beside the file (``eos_token``, ``pad_token``, ``bos_token``
  with ``add_bos_token: true``), as ``transformers`` saves one;
* the post-processor: the special token its single-text template puts after the text (end of
  document) and before it (beginning of document, which OLMo-core then expects at the start of
  every document), also inside a ``Sequence`` of processors, or BERT/RoBERTa's ``sep``/``cls``;
* the added special tokens by their usual names (:data:`EOS_NAMES`, :data:`PAD_NAMES`).

A tokenizer that names no end-of-document token needs ``data.tokenizer.eos_id``; one without a
padding token pads with its end-of-document id.

A tokenizer OLMo-core names (``data.tokenizer=gpt_neox_olmo_dolma_v1_5``: its
``TokenizerConfig.<name>()``, :data:`OLMO_CORE_TOKENIZERS`) needs no path where an installed
package carries its ``tokenizer.json`` (:data:`TOKENIZER_PACKAGES`; ai2-olmo-eval, ``olmx[eval]``,
carries OLMo's GPT-NeoX one): :func:`packaged_tokenizer` finds the file without importing the
package, and the plan names it as ``data.tokenizer.path``.

Precedence (:func:`resolve_tokenizer`): the tokenizer decides ``vocab_size``, ``eos_id``,
``pad_id`` and ``bos_id``. A value that differs from the data preset's
(``conf/data/<data.name>.yaml``) counts as set by you and must agree with the tokenizer:
``vocab_size`` at least the tokenizer's (the ids above it are never produced), the special ids
equal to those it names; where it names none, your value is used. The resolved values go into
the plan, so every later stage (the worker, ``olmx generate``, ``olmx export``) reads plain ids.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmx.config.schema import RunConfig, TokenizerConfig
from olmx.errors import ConfigError

#: Contents of an added special token that ends a document, most common first.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
#: Contents of an added special token that pads.
PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]", "<|padding|>")

#: The ``data.tokenizer`` keys a tokenizer file decides.
DECIDED = ("vocab_size", "eos_id", "pad_id", "bos_id")

#: The tokenizers OLMo-core names (``olmo_core.data.TokenizerConfig.<name>()``) and their Hugging
#: Face identifiers (``olmo_core.data.TokenizerName``).
OLMO_CORE_TOKENIZERS = {
    "dolma2": "allenai/dolma2-tokenizer",
    "dolma2_sigdig": "allenai/dolma2-tokenizer-sigdig",
    "gpt_neox_olmo_dolma_v1_5": "allenai/gpt-neox-olmo-dolma-v1_5",
    "gpt2": "gpt2",
}
#: Packages that carry tokenizer files, as ``(package, folder, the olmx extra that installs it,
#: the names it carries)``: a tokenizer's file is ``<folder>/<identifier with / as _>.json``.
TOKENIZER_PACKAGES = (("olmo_eval", "tokenizers", "olmx[eval]", ("gpt_neox_olmo_dolma_v1_5",)),)


def packaged_tokenizer(name: str) -> Path | None:
    """The ``tokenizer.json`` of the tokenizer OLMo-core calls ``name`` that an installed package
    of :data:`TOKENIZER_PACKAGES` carries (the package is found, not imported); None if none does."""
    identifier = OLMO_CORE_TOKENIZERS.get(name)
    if identifier is None:
        return None
    for package, folder, _, names in TOKENIZER_PACKAGES:
        spec = importlib.util.find_spec(package) if name in names else None
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root) / folder / f"{identifier.replace('/', '_')}.json"
            if path.is_file():
                return path
    return None


def named_tokenizer(name: str, *, field: str) -> Path:
    """:func:`packaged_tokenizer` of ``name``, or a :class:`ConfigError` naming ``field`` that says
    which names there are and which package to install."""
    path = packaged_tokenizer(name)
    if path is not None:
        return path
    carriers = [f"pip install '{extra}'" for _, _, extra, names in TOKENIZER_PACKAGES if name in names]
    carried = [n for *_, names in TOKENIZER_PACKAGES for n in names]
    if carriers:
        why = f"OLMo-core's tokenizer {name!r} comes with a package that is not installed: {', '.join(carriers)}"
    elif name in OLMO_CORE_TOKENIZERS:
        why = f"no package olmx knows carries OLMo-core's tokenizer {name!r} (one of {', '.join(carried)} does)"
    else:
        why = f"{name!r} is neither a file nor one of OLMo-core's tokenizers ({', '.join(OLMO_CORE_TOKENIZERS)})"
    raise ConfigError(field, f"{why}; or name a local tokenizer.json (data.tokenizer.path)")


@dataclass(frozen=True)
class TokenizerFile:
    """What a ``tokenizer.json`` says about its ids."""

    #: The file, as named.
    path: str
    #: SHA-256 of its bytes (what ``olmx data tokenize`` records and the plan compares).
    sha256: str
    #: Its largest id plus one.
    vocab_size: int
    #: End-of-document id (None: the file names none).
    eos_id: int | None
    #: Padding id (None: the file names none).
    pad_id: int | None
    #: The beginning-of-document id the tokenizer puts before every text (None: none).
    bos_id: int | None
    #: Where each special id was found, for the plan's rows (``{"eos_id": "post-processor"}``).
    found: dict[str, str]
    #: Content of every added token, by id.
    added: dict[int, str]

    def describe(self, key: str, value: int | None) -> str:
        """``value`` of ``key`` with its token and where it came from, for the plan."""
        if value is None:
            return "none"
        token = f" {self.added[value]!r}" if value in self.added else ""
        return f"{value}{token} ({self.found.get(key, 'data.tokenizer.' + key)})"


def tokenizer_file(spec: str | Path, *, field: str) -> Path:
    """A tokenizer given on the command line: a local ``tokenizer.json``, or a name of
    :data:`OLMO_CORE_TOKENIZERS` that is no file here (:func:`named_tokenizer`)."""
    path = Path(os.path.expanduser(str(spec)))
    if path.is_file() or str(spec) not in OLMO_CORE_TOKENIZERS:
        return path  # a missing file is named by whoever reads it
    return named_tokenizer(str(spec), field=field)


def tokenizer_path(tok: TokenizerConfig) -> Path:
    """``data.tokenizer.path`` with ``~`` expanded (callers check it is set)."""
    assert tok.path
    return Path(os.path.expanduser(tok.path))


def read_tokenizer_json(path: str | Path, *, field: str = "data.tokenizer.path") -> TokenizerFile:
    """The id facts of the ``tokenizer.json`` at ``path`` (see the module docstring). Raises
    :class:`ConfigError` naming ``field`` for a missing, unreadable or malformed file."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise ConfigError(field, f"'{path}' is not a file (a Hugging Face tokenizer.json)")
    st = p.stat()
    return _read(str(p), st.st_size, st.st_mtime_ns, field, str(path))


@functools.lru_cache(maxsize=8)
def _read(path: str, size: int, mtime_ns: int, field: str, named: str) -> TokenizerFile:
    """:func:`read_tokenizer_json` of one version of the file (cached: the plan asks twice)."""
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw)
        model = data["model"]
        vocab = model["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
        added = {int(t["id"]): str(t["content"]) for t in data.get("added_tokens") or []}
        special = {int(t["id"]): str(t["content"]) for t in data.get("added_tokens") or [] if t.get("special")}
        ids = [int(i) for i in ids] + list(added)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        what = f"invalid JSON ({exc})" if isinstance(exc, ValueError) else f"no model vocabulary ({exc!r})"
        raise ConfigError(field, f"'{named}' is not a Hugging Face tokenizer.json: {what}") from None
    if not ids or min(ids) < 0:
        raise ConfigError(field, f"'{named}' defines no token ids (or negative ones)")
    by_content = {c: i for i, c in added.items()}
    if isinstance(vocab, dict):
        by_content = {**{str(k): int(v) for k, v in vocab.items()}, **by_content}
    found: dict[str, str] = {}
    facts: dict[str, int | None] = {"eos_id": None, "pad_id": None, "bos_id": None}

    def take(key: str, value: int | None, where: str) -> None:
        if facts[key] is None and value is not None:
            facts[key], found[key] = value, where

    config = _tokenizer_config(Path(path).parent)
    for key, name in (("eos_id", "eos_token"), ("pad_id", "pad_token"), ("bos_id", "bos_token")):
        content = _token_content(config.get(name))
        if key == "bos_id" and not config.get("add_bos_token"):
            continue  # a BOS the tokenizer does not add is not put before documents
        if content is not None and content in by_content:
            take(key, by_content[content], f"tokenizer_config.json {name}")
    before, after = _template_specials(data.get("post_processor"), by_content)
    take("eos_id", after, "post-processor")
    take("bos_id", before, "post-processor")
    if isinstance(data.get("padding"), dict) and isinstance(data["padding"].get("pad_id"), int):
        take("pad_id", data["padding"]["pad_id"], "padding settings")
    for key, names in (("eos_id", EOS_NAMES), ("pad_id", PAD_NAMES)):
        for name in names:
            hit = next((i for i, c in special.items() if c == name), None)
            if hit is not None:
                take(key, hit, f"special token {name}")
                break
    return TokenizerFile(
        path=named,
        sha256=hashlib.sha256(raw).hexdigest(),
        vocab_size=max(ids) + 1,
        eos_id=facts["eos_id"],
        pad_id=facts["pad_id"],
        bos_id=facts["bos_id"],
        found=found,
        added=added,
    )


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` beside the tokenizer (empty when there is none or it is unreadable)."""
    try:
        data = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_specials(proc: Any, by_content: dict[str, int]) -> tuple[int | None, int | None]:
    """``(before, after)``: the special token ids the post-processor puts around a single text."""
    if not isinstance(proc, dict):
        return None, None
    kind = proc.get("type")
    if kind == "Sequence":
        before = after = None
        for sub in proc.get("processors") or []:
            b, a = _template_specials(sub, by_content)
            before, after = before if before is not None else b, after if after is not None else a
        return before, after
    if kind in ("BertProcessing", "RobertaProcessing"):
        cls, sep = proc.get("cls") or [None, None], proc.get("sep") or [None, None]
        return cls[1], sep[1]
    if kind != "TemplateProcessing":
        return None, None
    single = proc.get("single") or []
    at = next((i for i, piece in enumerate(single) if "Sequence" in piece), None)
    if at is None:
        return None, None
    specials = proc.get("special_tokens") or {}

    def token_id(piece: dict[str, Any]) -> int | None:
        name = (piece.get("SpecialToken") or {}).get("id")
        entry = specials.get(name) or {}
        ids = entry.get("ids") or []
        return int(ids[0]) if ids else by_content.get(name) if name else None

    before = token_id(single[at - 1]) if at > 0 else None
    after = token_id(single[at + 1]) if at + 1 < len(single) else None
    return before, after


def preset_tokenizer(data_name: str) -> TokenizerConfig:
    """``data.tokenizer`` as the data preset ``conf/data/<data_name>.yaml`` sets it (the schema's
    defaults where there is no such preset): what counts as "not set by you"."""
    import yaml

    from olmx.config.compose import conf_dir

    try:
        raw = yaml.safe_load((conf_dir() / "data" / f"{data_name}.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        raw = {}
    values = raw.get("tokenizer") if isinstance(raw, dict) else None
    known = {f.name for f in dataclasses.fields(TokenizerConfig)}
    return TokenizerConfig(**{k: v for k, v in (values or {}).items() if k in known})


def resolve_tokenizer(run: RunConfig, *, files_here: bool = True) -> RunConfig:
    """``run`` with ``data.tokenizer``'s ids taken from ``data.tokenizer.path`` (precedence in the
    module docstring); unchanged without a path, or when the file lives on the target's machines
    (``files_here`` false and no such file here: the ids you set are used as they are).
    A byte-level name (``bytes``) with a tokenizer becomes the tokenizer folder's name, so that
    nothing treats the ids as bytes. Raises :class:`ConfigError` for a value that conflicts."""
    tok = run.data.tokenizer
    if not tok.path and tok.name in OLMO_CORE_TOKENIZERS:
        found = packaged_tokenizer(tok.name)
        if found is None and run.data.name != "numpy":  # pre-tokenized data may carry the name as a label
            named_tokenizer(tok.name, field="data.tokenizer.name")
        if found is not None:
            tok = dataclasses.replace(tok, path=str(found))
            run = dataclasses.replace(run, data=dataclasses.replace(run.data, tokenizer=tok))
    if not tok.path:
        return run
    if not files_here and not tokenizer_path(tok).is_file():
        return run
    facts = read_tokenizer_json(tok.path)
    preset = preset_tokenizer(run.data.name)
    mine = {key: getattr(tok, key) for key in DECIDED if getattr(tok, key) != getattr(preset, key)}
    where = f"the tokenizer {tok.path}"
    vocab = facts.vocab_size
    if "vocab_size" in mine:
        if mine["vocab_size"] < facts.vocab_size:
            raise ConfigError(
                "data.tokenizer.vocab_size",
                f"{tok.path} defines {facts.vocab_size:,} token ids, more than data.tokenizer.vocab_size="
                f"{mine['vocab_size']:,}: a different tokenizer, or leave vocab_size unset (the tokenizer's)",
            )
        vocab = mine["vocab_size"]
    values: dict[str, int | None] = {"vocab_size": vocab}
    for key in ("eos_id", "pad_id", "bos_id"):
        said = getattr(facts, key)
        if key in mine and said is not None and mine[key] != said:
            raise ConfigError(
                f"data.tokenizer.{key}",
                f"{mine[key]} conflicts with {where}, whose {key.removesuffix('_id')} is {facts.describe(key, said)}; "
                f"leave data.tokenizer.{key} unset",
            )
        values[key] = said if said is not None else mine.get(key)
    if values["eos_id"] is None:
        raise ConfigError(
            "data.tokenizer.eos_id",
            f"{where} names no end-of-document token (no eos_token in a tokenizer_config.json beside it, none "
            f"after the text in its post-processor, no special token named {', '.join(EOS_NAMES)}): set "
            "data.tokenizer.eos_id to the id that ends each document",
        )
    if values["pad_id"] is None:
        values["pad_id"] = values["eos_id"]
    name = tok.name
    if name == "bytes":
        p = tokenizer_path(tok)
        name = (p.parent.name if p.name == "tokenizer.json" else p.stem) or "tokenizer"
    new = dataclasses.replace(tok, name=name, **values)  # type: ignore[arg-type]
    return dataclasses.replace(run, data=dataclasses.replace(run.data, tokenizer=new))


def tokenizer_rows(run: RunConfig) -> list[tuple[str, str]]:
    """The plan's rows about the run's tokenizer file (none without ``data.tokenizer.path``)."""
    tok = run.data.tokenizer
    if not tok.path:
        return []
    facts = read_tokenizer_json(tok.path)
    extra = f", {tok.vocab_size - facts.vocab_size:,} more never produced" if tok.vocab_size > facts.vocab_size else ""
    pad = facts.describe("pad_id", tok.pad_id) if tok.pad_id != tok.eos_id or facts.pad_id is not None else "eos"
    return [
        ("tokenizer", f"{tok.path} (sha256 {facts.sha256[:12]}), {facts.vocab_size:,} ids{extra}"),
        (
            "special ids",
            f"eos {facts.describe('eos_id', tok.eos_id)}, pad {pad}, "
            f"bos {facts.describe('bos_id', tok.bos_id) if tok.bos_id is not None else 'none'}",
        ),
    ]
