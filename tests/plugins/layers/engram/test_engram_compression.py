"""TokenizerCompression: the official normalisation, the byte-level map, specials."""

import pytest
import torch

from olmx_plugins.layers.engram.compression import (
    TokenizerCompression,
    byte_level_tokens,
    hf_tokens,
    normalize_token_text,
)

# Expected outputs produced by the official normaliser itself: the `tokenizers` 0.23.3
# normalizers.Sequence of deepseek-ai/Engram engram_demo_v1.py (NFKC, NFD, StripAccents,
# Lowercase, Replace, sentinel, Strip), run in a scratch virtualenv outside this repository.
HF_NORMALIZED = [
    (" Apple", "apple"),
    ("APPLE", "apple"),
    ("Straße", "straße"),
    ("\ufb01", "fi"),
    ("\uff28\uff45\uff4c\uff4c\uff4f", "hello"),
    ("\u039f\u0394\u039f\u03a3", "\u03bf\u03b4\u03bf\u03c3"),  # per-char lowercase: no final sigma
    ("\u0130", "i"),
    ("\u00e9", "e"),
    ("e\u0301", "e"),
    (" ", " "),
    ("  ", " "),
    ("\t\n", " "),
    (" x ", "x"),
    ("\u00a0b\u00a0", "b"),
    ("a\u2028", "a"),
    ("\u3000", " "),
    ("\x1cA\x1f", "\x1ca\x1f"),  # U+001C/U+001F are not Unicode White_Space
    ("\ue000", " "),  # the official sentinel turns into a space
    ("\u01c4", "dz"),
    ("\u00bd", "1\u20442"),
    ("Ca\u0308fe\u0301 \t\r\n bar", "cafe bar"),
    ("\x0b", ""),
    ("\u0915\u093f", "\u0915"),  # spacing marks (Mc) are stripped too
]


@pytest.mark.parametrize("text,expected", HF_NORMALIZED)
def test_normalization_matches_official(text, expected):
    assert normalize_token_text(text) == expected


def test_byte_level_map():
    comp = TokenizerCompression(byte_level_tokens())
    assert comp.vocab_size == 384
    # 128 ASCII bytes - 26 upper-case letters - \t \n \r (merged with space) = 99,
    # + 128 high bytes (each its own id: U+FFFD rule) + 128 special/unused ids.
    assert comp.compressed_vocab_size == 99 + 128 + 128
    c = comp.canonical
    assert c(ord("A")) == c(ord("a")) and c(ord("Z")) == c(ord("z"))
    assert c(ord(" ")) == c(ord("\t")) == c(ord("\n")) == c(ord("\r"))
    assert c(ord("a")) != c(ord("b")) and c(0x0B) != c(0x0C)  # emptied -> keyed by raw text
    high = {c(b) for b in range(0x80, 0x100)}
    assert len(high) == 128 and not high & {c(b) for b in range(0x80)}
    specials = {c(i) for i in range(256, 384)}
    assert len(specials) == 128 and not specials & {c(b) for b in range(256)}
    # Canonical ids are numbered by first appearance, so the map is onto 0..V'-1.
    assert sorted(set(comp.lookup.tolist())) == list(range(comp.compressed_vocab_size))


def test_compress_tensor():
    comp = TokenizerCompression(byte_level_tokens())
    ids = torch.tensor([[ord("Q"), ord("q"), 256, 0x9F]])
    out = comp.compress(ids)
    assert out.dtype == torch.long and out.shape == ids.shape
    assert out[0, 0] == out[0, 1]
    assert out.tolist()[0][2:] == [comp.canonical(256), comp.canonical(0x9F)]


def test_replacement_char_uses_raw_token_and_specials_never_merge():
    tokens = [
        ("Hello", "Hello"),
        (" hello", "Ġhello"),
        ("\ufffd", "zz"),  # partial UTF-8: keyed by raw token
        ("\ufffd", "zy"),
        (None, "hello"),  # special whose raw string equals a text key
        ("ZZ", "x"),  # normalises to a raw key: one key space, as in the official code
    ]
    comp = TokenizerCompression(tokens)
    lookup = comp.lookup.tolist()
    assert lookup[0] == lookup[1]
    assert lookup[2] != lookup[3]
    assert lookup[4] not in (lookup[0], lookup[2], lookup[3])
    assert lookup[5] == lookup[2]
    assert comp.compressed_vocab_size == 4


def test_hf_tokens_duck_typed():
    class FakeHF:
        vocab = ["<s>", "ĠThe", "the", "\u00e2"]
        texts = ["<s>", " The", "the", "\ufffd"]

        def __len__(self):
            return len(self.vocab)

        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens is False
            return self.texts[ids[0]]

        def convert_ids_to_tokens(self, i):
            return self.vocab[i]

    tokens = hf_tokens(FakeHF())
    assert tokens[3] == ("\ufffd", "\u00e2")
    lookup = TokenizerCompression(tokens).lookup.tolist()
    assert lookup == [0, 1, 1, 2]


def test_package_import_is_light_and_exports_lazily():
    import subprocess
    import sys

    import olmx_plugins.layers.engram as engram
    from olmx_plugins.layers.engram.hashing import NgramHasher

    code = (
        "import sys, olmx_plugins.layers.engram; assert 'torch' not in sys.modules and 'olmo_core' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert engram.NgramHasher is NgramHasher
    assert engram.TokenizerCompression is TokenizerCompression
    with pytest.raises(AttributeError):
        _ = engram.not_there


def _tokenizer_json(path, vocab: dict[str, int], added: list[dict], *, model="BPE", decoder="ByteLevel"):
    import json

    path.write_text(
        json.dumps(
            {
                "model": {"type": model, "vocab": vocab, "merges": []},
                "decoder": {"type": decoder},
                "added_tokens": added,
            }
        )
    )
    return str(path)


def test_tokenizer_json_of_a_byte_level_bpe_decodes_each_id_as_the_tokenizers_package(tmp_path):
    """A dolma2-style tokenizer.json read without ``tokenizers``: token strings in GPT-2's byte
    alphabet (``Ġ`` = space, ``Ã©`` = the UTF-8 bytes of é), a partial UTF-8 byte, a special."""
    from olmx_plugins.layers.engram.compression import tokenizer_json_tokens

    vocab = {"Apple": 0, "Ġapple": 1, "APPLE": 2, "Ã©": 3, "e": 4, "Ã": 5, "Ä": 6}
    path = _tokenizer_json(tmp_path / "tokenizer.json", vocab, [{"id": 7, "content": "<|endoftext|>", "special": True}])
    tokens = tokenizer_json_tokens(path, vocab_size=9)
    assert tokens == [
        ("Apple", "Apple"),
        (" apple", "Ġapple"),
        ("APPLE", "APPLE"),
        ("é", "Ã©"),
        ("e", "e"),
        ("\ufffd", "Ã"),
        ("\ufffd", "Ä"),
        ("<|endoftext|>", "<|endoftext|>"),
        (None, "<|unused_8|>"),
    ]
    ids = TokenizerCompression(tokens).lookup.tolist()
    assert ids[0] == ids[1] == ids[2] and ids[3] == ids[4]  # case, space, accents collapse
    assert len({ids[0], ids[3], ids[5], ids[6], ids[7], ids[8]}) == 6  # partial bytes keep their raw keys
    with pytest.raises(ValueError, match="not a byte-level BPE tokenizer"):
        tokenizer_json_tokens(_tokenizer_json(tmp_path / "sp.json", {"▁a": 0}, [], decoder="Metaspace"), 1)


def test_engram_compression_with_a_non_byte_tokenizer_needs_its_tokenizer_json(tmp_path):
    from olmx.config.compose import compose, to_object
    from olmx.errors import ConfigError
    from olmx.plan.resolve import resolve
    from olmx.registry import registry

    reg = registry()
    data = tmp_path / "tokens.npy"
    data.write_bytes(b"\0" * 1024)
    common = [
        "layers=[engram]",
        "data=numpy",
        f"data.paths=[{data}]",
        "data.seq_len=64",
        "data.tokenizer.vocab_size=9",
        "data.tokenizer.eos_id=7",
        "data.tokenizer.pad_id=8",
        "infra.nproc_per_node=1",
        "parallel=[]",
    ]
    with pytest.raises(ConfigError, match="layers.engram.compression.*set data.tokenizer.path"):
        resolve(to_object(compose(common, reg), reg), reg)
    bad = _tokenizer_json(tmp_path / "wp.json", {"a": 0}, [], model="WordPiece")
    with pytest.raises(ConfigError, match="data.tokenizer.path: cannot read the tokenizer.*not a byte-level BPE"):
        resolve(to_object(compose([*common, f"data.tokenizer.path={bad}"], reg), reg), reg)
    good = _tokenizer_json(tmp_path / "tokenizer.json", {"a": 0, "Ġa": 1}, [{"id": 7, "content": "<eos>"}])
    plan = resolve(to_object(compose([*common, f"data.tokenizer.path={good}"], reg), reg), reg)
    assert dict(plan.sections["layers.engram"])["tokenizer compression"] == f"dolma2 vocabulary from {good}"
