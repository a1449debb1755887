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
    """olmx's byte-level tokenizer (258 ids: bytes, eos 256, pad 257) in a model vocabulary
    padded to 384: V' counts the real ids only, as the official code (before: 355, padding
    included)."""
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    assert comp.vocab_size == 384 and comp.num_tokenizer_ids == 258
    # 128 ASCII bytes - 26 upper-case letters - \t \n \r (merged with space) = 99,
    # + 128 high bytes (each its own id: U+FFFD rule) + eos + pad.
    assert comp.compressed_vocab_size == 99 + 128 + 2 == 229
    c = comp.canonical
    assert c(ord("A")) == c(ord("a")) and c(ord("Z")) == c(ord("z"))
    assert c(ord(" ")) == c(ord("\t")) == c(ord("\n")) == c(ord("\r"))
    assert c(ord("a")) != c(ord("b")) and c(0x0B) != c(0x0C)  # emptied -> keyed by raw text
    high = {c(b) for b in range(0x80, 0x100)}
    assert len(high) == 128 and not high & {c(b) for b in range(0x80)}
    assert c(256) != c(257) and not {c(256), c(257)} & {c(b) for b in range(256)}
    # Padding ids take the last real id's canonical id (the official code clips to it).
    assert {c(i) for i in range(258, 384)} == {c(257)}
    # Canonical ids are numbered by first appearance, so the map is onto 0..V'-1.
    assert sorted(set(comp.lookup.tolist())) == list(range(comp.compressed_vocab_size))
    assert TokenizerCompression(byte_level_tokens(vocab_size=384)).compressed_vocab_size == 355


def test_compress_tensor():
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
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
    tokens = tokenizer_json_tokens(path)
    assert tokens == [
        ("Apple", "Apple"),
        (" apple", "Ġapple"),
        ("APPLE", "APPLE"),
        ("é", "Ã©"),
        ("e", "e"),
        ("\ufffd", "Ã"),
        ("\ufffd", "Ä"),
        ("<|endoftext|>", "<|endoftext|>"),
    ]
    ids = TokenizerCompression(tokens).lookup.tolist()
    assert ids[0] == ids[1] == ids[2] and ids[3] == ids[4]  # case, space, accents collapse
    assert len({ids[0], ids[3], ids[5], ids[6], ids[7]}) == 5  # partial bytes keep their raw keys
    # An id the file leaves out decodes to "", as tokenizers skips it.
    gap = tokenizer_json_tokens(_tokenizer_json(tmp_path / "gap.json", {"a": 0, "b": 2}, []))
    assert gap == [("a", "a"), ("", ""), ("b", "b")]
    with pytest.raises(ValueError, match="not a byte-level BPE tokenizer"):
        tokenizer_json_tokens(_tokenizer_json(tmp_path / "sp.json", {"▁a": 0}, [], decoder="Metaspace"))


def test_engram_compression_with_a_non_byte_tokenizer_needs_its_tokenizer_json(tmp_path):
    from olmx.config.compose import compose, to_object
    from olmx.errors import ConfigError
    from olmx.plan.resolve import plan_from_overrides, resolve
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
        plan_from_overrides(common, reg)
    bad = _tokenizer_json(tmp_path / "wp.json", {"a": 0}, [], model="WordPiece")
    with pytest.raises(ConfigError, match="data.tokenizer.path: cannot read the tokenizer.*not a byte-level BPE"):
        plan_from_overrides([*common, f"data.tokenizer.path={bad}"], reg)
    good = _tokenizer_json(tmp_path / "tokenizer.json", {"a": 0, "Ġa": 1}, [{"id": 7, "content": "<eos>"}])
    plan = plan_from_overrides([*common, f"data.tokenizer.path={good}"], reg)
    assert (
        dict(plan.sections["layers.engram"])["tokenizer compression"] == f"{tmp_path.name} vocabulary from {good}"
    )  # named by its folder
    assert (
        dict(plan.sections["layers.engram"])["canonical ids V'"] == "3 of the tokenizer's 8 ids (model vocabulary 128)"
    )
    with pytest.raises(ConfigError, match="defines 8 token ids, more than data.tokenizer.vocab_size=7"):
        resolve(
            to_object(
                compose(
                    [
                        *common,
                        f"data.tokenizer.path={good}",
                        "data.tokenizer.vocab_size=7",
                        "data.tokenizer.eos_id=5",
                        "data.tokenizer.pad_id=6",
                    ],
                    reg,
                ),
                reg,
            ),
            reg,
        )


#: A byte-level BPE vocabulary of 11 real ids in GPT-2's byte alphabet (Ġ = space, Ċ = newline,
#: Ã© = é), whose keys are "apple" (0-2), "e" (3-4), the raw "Ã" and "Ä" (partial UTF-8), " "
#: (7-9: space, two spaces, newline) and the end-of-text token: V' = 6.
SMALL_VOCAB = {"Apple": 0, "Ġapple": 1, "APPLE": 2, "Ã©": 3, "e": 4, "Ã": 5, "Ä": 6, "Ġ": 7, "ĠĠ": 8, "Ċ": 9}
SMALL_ADDED = [{"id": 10, "content": "<|endoftext|>", "special": True}]
SMALL_V_PRIME = 6


def test_compressed_vocabulary_counts_the_real_ids_of_a_padded_tokenizer(tmp_path):
    """V' of a byte-level tokenizer.json of 11 ids in a model vocabulary padded to 128: the
    number of distinct keys over the 11 real ids (6), not over the 128 padded ids (123 before);
    it sets the hash multipliers' bound, so the hash ids are the official ones."""
    import numpy as np

    from olmx_plugins.layers.engram.compression import tokenizer_json_tokens
    from olmx_plugins.layers.engram.hashing import NgramHasher

    path = _tokenizer_json(tmp_path / "tokenizer.json", SMALL_VOCAB, SMALL_ADDED)
    tokens = tokenizer_json_tokens(path)
    assert len(tokens) == 11
    comp = TokenizerCompression(tokens, vocab_size=128)
    assert comp.compressed_vocab_size == SMALL_V_PRIME and comp.vocab_size == 128
    lookup = comp.lookup.tolist()
    assert lookup[:11] == [0, 0, 0, 1, 1, 2, 3, 4, 4, 4, 5]
    assert set(lookup[11:]) == {lookup[10]}  # padding: the official clip to the last real id
    hasher = NgramHasher(
        layer_ids=[1],
        max_ngram_size=3,
        n_head_per_ngram=2,
        vocab_size_per_ngram=[50, 50],
        pad_id=comp.canonical(10),
        seed=0,
        compressed_vocab_size=comp.compressed_vocab_size,
    )
    half_bound = (np.iinfo(np.int64).max // SMALL_V_PRIME) // 2
    r = np.random.default_rng(10007).integers(0, half_bound, size=3, dtype=np.int64)
    assert hasher.multipliers(1) == [int(v) * 2 + 1 for v in r]


def test_compressed_vocabulary_equals_the_official_one_with_the_tokenizers_package(tmp_path):
    """With the ``tokenizers`` package (not a dependency of olmx): the tokenizer.json of a real
    byte-level BPE tokenizer, decoded id by id as the official CompressedTokenizer does (its
    normaliser, ``range(len(tokenizer))``), gives the same keys, hence the same map and V'."""
    tk = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, normalizers

    from olmx_plugins.layers.engram.compression import tokenizer_json_tokens

    tok = tk.Tokenizer(models.BPE(vocab=SMALL_VOCAB, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    sentinel = "\ue000"
    official = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), sentinel),
            normalizers.Strip(),
            normalizers.Replace(sentinel, " "),
        ]
    )
    keys: dict[str, int] = {}
    expected = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        key = tok.id_to_token(i) if "\ufffd" in text else (official.normalize_str(text) or text)
        expected.append(keys.setdefault(key, len(keys)))
    comp = TokenizerCompression(tokenizer_json_tokens(path), vocab_size=128)
    assert comp.lookup.tolist()[: len(expected)] == expected
    assert comp.compressed_vocab_size == len(keys) == SMALL_V_PRIME


@pytest.mark.parametrize("bad", [-1, -100, 384, 10**6])
def test_input_ids_outside_the_vocabulary_are_refused(bad):
    """Negative ids (an ignore index such as -100 belongs in labels) and ids beyond the padded
    vocabulary are refused with the offending value, where they used to wrap around or fail in
    indexing; the official code passes negatives to the hash and clips the rest."""
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    ids = torch.tensor([[ord("a"), bad, ord("b")]])
    hint = "belongs in the labels" if bad < 0 else ""
    with pytest.raises(ValueError, match=rf"Engram input ids must be in \[0, 384\), got {bad}.*{hint}"):
        comp.compress(ids)
    with pytest.raises(ValueError, match="outside"):
        comp.canonical(bad)
    assert comp.compress(torch.tensor([[300, 383]])).tolist() == [[comp.canonical(257)] * 2]
    assert comp.compress(torch.empty(0, 5, dtype=torch.long)).shape == (0, 5)
