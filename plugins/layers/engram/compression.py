"""Engram tokenizer compression: a surjective map from raw token ids to canonical ids.

Method (arXiv 2601.07372 §2.2, "tokenizer compression", and ``CompressedTokenizer`` in the
official deepseek-ai/Engram ``engram_demo_v1.py``; reimplemented here without the Hugging Face
``tokenizers`` package):

For every raw id, in increasing order, a key is computed from the token:

* if its decoded text contains U+FFFD (a partial UTF-8 sequence, e.g. a lone byte >= 0x80),
  the key is the raw token string;
* otherwise the key is the normalised text, or the text itself when normalising empties it.
  The normalisation is the official sequence NFKC, NFD, strip accents (drop every Unicode mark,
  categories Mn/Mc/Me), lowercase (per character, like Rust's ``char::to_lowercase``), collapse
  runs of ``[ \\t\\r\\n]`` to one space, keep a result that is exactly ``" "``, else strip
  Unicode White_Space from both ends (and, like the official sentinel trick, turn U+E000 into
  a space). Measured against ``tokenizers`` 0.23.3 on every code point up to U+2FFFF plus
  20,000 random strings: equal except for 0.3 % of inputs, all rare characters whose Unicode
  data differs between Python's ``unicodedata`` and the tables compiled into ``tokenizers``;
  all ASCII tokens agree.

Raw ids whose keys are equal share a canonical id; canonical ids are numbered by first
appearance. So ``"Apple"``, ``" apple"`` and ``"APPLE"`` become one id.

Special tokens: the official code decodes them like any other token. Here a tokenizer may
instead give ``None`` as the decoded text of a special id; such an id gets its own canonical
id, keyed by its raw token string, and never merges with a text token.

Which ids: the map is built over the tokenizer's real ids only (the official code walks
``range(len(tokenizer))``), so ``V'``, the number of canonical ids, which bounds every hash
multiplier, is the official one and so are the hash ids. The model's vocabulary padding (ids
the tokenizer never produces) maps to the canonical id of the last real id, as the official
``_compress`` clips them. Negative ids and ids beyond the padded vocabulary are refused.

The tokenizer enters only as a sequence of ``(decoded_text | None, raw_token_string)`` pairs,
one per raw id: see :func:`byte_level_tokens` (olmx's byte-level tokenizer),
:func:`tokenizer_json_tokens` (a local Hugging Face ``tokenizer.json`` of a byte-level BPE
tokenizer, such as OLMo's dolma2, read without the ``tokenizers`` package) and
:func:`hf_tokens` (any Hugging Face tokenizer object, by duck typing).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported when a map is built: the plan reads token tables without it
    import torch

__all__ = [
    "TokenizerCompression",
    "byte_level_tokens",
    "canonical_ids",
    "check_id_range",
    "hf_tokens",
    "normalize_token_text",
    "tokenizer_json_tokens",
]

_WS_RUN = re.compile(r"[ \t\r\n]+")
# Unicode White_Space (what Rust's char::is_whitespace, used by the official Strip, accepts).
# Python's str.strip() would also strip U+001C..U+001F, which are not White_Space.
_UNICODE_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_REPLACEMENT_CHAR = "\ufffd"
_SENTINEL = "\ue000"


def normalize_token_text(text: str) -> str:
    """The official Engram normalisation of one token's decoded text (see module docstring)."""
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = "".join(c.lower() for c in s)
    s = _WS_RUN.sub(" ", s)
    # The official pipeline protects a lone " " from Strip with a private-use sentinel and then
    # turns every sentinel back into " ", including one that was in the text: do the same.
    if s == " ":
        s = _SENTINEL
    return s.strip(_UNICODE_WHITE_SPACE).replace(_SENTINEL, " ")


def canonical_ids(tokens: Iterable[tuple[str | None, str]]) -> tuple[list[int], int]:
    """The canonical id of every raw id of ``tokens`` (see the module docstring) and their
    number ``V'``, without torch (the plan shows ``V'``)."""
    key_to_id: dict[Any, int] = {}
    lookup: list[int] = []
    for text, raw in tokens:
        key: Any
        if text is None:
            key = ("special", raw)
        elif _REPLACEMENT_CHAR in text:
            key = raw
        else:
            key = normalize_token_text(text) or text
        lookup.append(key_to_id.setdefault(key, len(key_to_id)))
    return lookup, len(key_to_id)


#: Why a negative input id is refused (the hint of :func:`check_id_range`).
NEGATIVE_ID_HINT = (
    "; a negative id (such as the ignore index -100) belongs in the labels, never in the input ids "
    "(the model's embedding refuses it too)"
)


def check_id_range(ids: torch.Tensor, high: int, what: str) -> None:
    """Refuse ``ids`` outside ``[0, high)``.

    CPU tensors: a ``ValueError`` that names some of the offending values. Other devices: an
    asynchronous device-side assertion (``torch._assert_async``, no host synchronisation), which
    stops the run at the next synchronisation, as an out-of-range embedding lookup would.
    """
    import torch

    if ids.numel() == 0:
        return
    if ids.device.type != "cpu":
        torch._assert_async(((ids >= 0) & (ids < high)).all(), f"{what} must be in [0, {high})")
        return
    low_seen, high_seen = torch.stack(list(torch.aminmax(ids))).tolist()  # one read back
    if low_seen >= 0 and high_seen < high:
        return
    bad = ids[(ids < 0) | (ids >= high)].unique().tolist()
    shown = ", ".join(str(v) for v in bad[:8]) + (", ..." if len(bad) > 8 else "")
    raise ValueError(f"{what} must be in [0, {high}), got {shown}" + (NEGATIVE_ID_HINT if low_seen < 0 else ""))


class TokenizerCompression:
    """The canonical-id map of one tokenizer.

    :param tokens: For each real raw id ``0..len(tokens)-1`` of the tokenizer (the position in
        the sequence: what the official code walks, ``range(len(tokenizer))``), the pair
        ``(decoded_text, raw_token_string)``; ``decoded_text`` is ``None`` for special ids.
    :param vocab_size: Raw ids accepted by :meth:`compress`: the model's (padded) vocabulary,
        at least ``len(tokens)``; default ``len(tokens)``.

    ``V'`` (:attr:`compressed_vocab_size`, which bounds the hash multipliers) counts the keys of
    the real ids only, as in the official code. Padding ids ``len(tokens)..vocab_size-1``, which
    the tokenizer never produces, take the canonical id of the last real id: the official
    ``_compress`` clips every id above the tokenizer's to the last one. Ids outside
    ``[0, vocab_size)`` are refused (:func:`check_id_range`): the official code would let a
    negative id through to the hash, but the model's embedding cannot look it up either.
    """

    def __init__(self, tokens: Iterable[tuple[str | None, str]], *, vocab_size: int | None = None):
        lookup, compressed = canonical_ids(tokens)
        if not lookup:
            raise ValueError("the tokenizer has no tokens")
        real = len(lookup)
        if vocab_size is None:
            vocab_size = real
        if vocab_size < real:
            raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {real} ids")
        import torch

        lookup += [lookup[-1]] * (vocab_size - real)
        self._lookup = torch.tensor(lookup, dtype=torch.long)
        self._device_lookup: dict[torch.device, torch.Tensor] = {}
        self.num_tokenizer_ids = real
        """Real ids of the tokenizer (``len(tokens)``); the rest of :attr:`vocab_size` is padding."""
        self.compressed_vocab_size = compressed
        """Number of canonical ids, ``V'``: distinct keys over the tokenizer's real ids."""

    @property
    def vocab_size(self) -> int:
        """Number of raw ids accepted, ``V`` (padding included)."""
        return self._lookup.numel()

    @property
    def lookup(self) -> torch.Tensor:
        """``LongTensor[V]``: canonical id of every raw id (a CPU copy)."""
        return self._lookup.clone()

    def canonical(self, raw_id: int) -> int:
        """Canonical id of one raw id (use it for the pad id given to the hasher)."""
        if not 0 <= raw_id < self.vocab_size:
            raise ValueError(f"raw id {raw_id} is outside [0, {self.vocab_size})")
        return int(self._lookup[raw_id])

    def compress(self, raw_ids: torch.Tensor) -> torch.Tensor:
        """Map a tensor of raw ids in ``[0, V)`` to canonical ids in ``[0, V')``, on the
        tensor's device; other ids are refused (:func:`check_id_range`)."""
        check_id_range(raw_ids, self.vocab_size, "Engram input ids")
        device = raw_ids.device
        if device not in self._device_lookup:
            self._device_lookup[device] = self._lookup.to(device)
        return self._device_lookup[device][raw_ids.long()]


def byte_level_tokens(
    *,
    vocab_size: int = 258,
    special_tokens: Mapping[int, str] | None = None,
) -> list[tuple[str | None, str]]:
    """Token table of olmx's byte-level tokenizer: ids 0..255 are the bytes, the rest of its
    ``vocab_size`` ids (``data.tokenizer.vocab_size``, not the padded model vocabulary) special.

    A byte decodes to its one-character text when it is ASCII and to U+FFFD otherwise (a lone
    byte >= 0x80 is not valid UTF-8), so high bytes keep their own ids, keyed ``<0xHH>``.
    Ids >= 256 are special: named by ``special_tokens`` (default: olmx's 256 = eos,
    257 = pad), the rest ``<|unused_i|>``.
    """
    if vocab_size < 256:
        raise ValueError(f"vocab_size={vocab_size} must be >= 256 for a byte-level tokenizer")
    specials = {256: "<|endoftext|>", 257: "<|pad|>"} if special_tokens is None else special_tokens
    tokens: list[tuple[str | None, str]] = [
        (bytes([b]).decode("utf-8", errors="replace"), f"<0x{b:02X}>") for b in range(256)
    ]
    tokens += [(None, specials.get(i, f"<|unused_{i}|>")) for i in range(256, vocab_size)]
    return tokens


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's ``bytes_to_unicode``), inverted: the printable
    character that stands for each byte in a token string -> the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def tokenizer_json_tokens(path: str) -> list[tuple[str | None, str]]:
    """Token table of the byte-level BPE tokenizer saved in the Hugging Face ``tokenizer.json``
    at ``path``: one entry per id up to the largest the file defines (its vocabulary and added
    tokens; ``len(tokenizer)``, what the official code walks, for the contiguous ids of every
    real tokenizer), each decoded as ``tokenizers`` decodes one id (its characters mapped back
    to bytes, then UTF-8 with U+FFFD for a partial sequence); added tokens decode to their
    content; an id the file leaves out decodes to ``""``, as ``tokenizers`` skips it. The
    model's vocabulary padding is not in the table (see :class:`TokenizerCompression`).
    ``ValueError`` for a file of another kind."""
    import json

    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    model, decoder = data.get("model") or {}, data.get("decoder") or {}
    decoders = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    if model.get("type") != "BPE" or not any(d.get("type") == "ByteLevel" for d in decoders):
        raise ValueError(
            f"{path}: not a byte-level BPE tokenizer (model {model.get('type')!r}, decoder "
            f"{decoder.get('type')!r}); only those are read without the tokenizers package"
        )
    alphabet = _byte_level_alphabet()
    table: dict[int, tuple[str | None, str]] = {}
    for token, i in model["vocab"].items():
        raw = bytes(alphabet[c] for c in token if c in alphabet)
        table[i] = (raw.decode("utf-8", errors="replace"), token)
    for added in data.get("added_tokens", []):
        table[added["id"]] = (added["content"], added["content"])
    return [table.get(i, ("", "")) for i in range(max(table, default=-1) + 1)]


def hf_tokens(tokenizer: Any) -> list[tuple[str | None, str]]:
    """Token table of a Hugging Face tokenizer, decoded exactly as the official code does.

    Duck-typed (``len``, ``decode``, ``convert_ids_to_tokens``): olmx does not depend on
    ``transformers``. Special tokens are decoded too, so the map equals the official one.
    """
    return [
        (
            tokenizer.decode([i], skip_special_tokens=False),
            str(tokenizer.convert_ids_to_tokens(i)),
        )
        for i in range(len(tokenizer))
    ]
