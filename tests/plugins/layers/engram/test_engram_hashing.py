"""NgramHasher: identity with the official NgramHashMapping, ranges, primes, locality."""

import numpy as np
import pytest
import torch

from olmx_plugins.layers.engram.compression import TokenizerCompression, byte_level_tokens
from olmx_plugins.layers.engram.hashing import NgramHasher, is_prime, ngram_table_sizes

TEXT = "Only Alexander the Great could tame the horse Bucephalus."

# Golden values. Produced by re-running the official deepseek-ai/Engram engram_demo_v1.py
# NgramHashMapping (commit 1aac57aa, transcribed line by line in a scratch directory outside
# this repository, numpy 2.4.6 + sympy 1.14.0), with its CompressedTokenizer's lookup table
# replaced by that of TokenizerCompression(byte_level_tokens()) over olmx's 258 real
# byte-level ids (V' = 229 = its num_new_token, raw pad 257 -> 228), on the UTF-8 bytes of
# TEXT (the transcription reproduced the earlier values, made with V' = 355 over the padded 384
# ids, before giving these). "demo": the demo's EngramConfig (vocab [129280*5]*2, N=3, K=8,
# layers [1, 15], seed 0). "n4": vocab [1000, 2000, 3000], N=4, K=2, layers [0, 3], seed 7.
GOLDEN = {
    "demo": dict(
        args=dict(
            vocab_size_per_ngram=[129280 * 5] * 2, max_ngram_size=3, n_head_per_ngram=8, layer_ids=[1, 15], seed=0
        ),
        layers={
            1: dict(
                primes=[
                    646403,
                    646411,
                    646421,
                    646423,
                    646433,
                    646453,
                    646519,
                    646523,
                    646537,
                    646543,
                    646549,
                    646571,
                    646573,
                    646577,
                    646609,
                    646619,
                ],
                mult=[33159946119714555, 2094292584448137, 15560331220388487],
                total=298963725,
                t0=[
                    187909,
                    508704,
                    383309,
                    175651,
                    138135,
                    355882,
                    578509,
                    23895,
                    352816,
                    511332,
                    481937,
                    586630,
                    277006,
                    229094,
                    510893,
                    576351,
                ],
                t_last=[
                    283886,
                    530668,
                    83854,
                    322477,
                    557447,
                    24980,
                    86333,
                    192674,
                    42434,
                    366455,
                    411124,
                    51607,
                    381132,
                    515904,
                    349621,
                    455900,
                ],
            ),
            15: dict(
                primes=[
                    646631,
                    646637,
                    646643,
                    646669,
                    646687,
                    646721,
                    646757,
                    646771,
                    646781,
                    646823,
                    646831,
                    646837,
                    646843,
                    646859,
                    646873,
                    646879,
                ],
                mult=[12513761432178007, 24240919258676339, 23335965766886909],
                total=292653332,
                t0=[
                    313837,
                    173146,
                    624483,
                    104008,
                    114996,
                    282255,
                    423829,
                    596981,
                    88623,
                    551127,
                    398064,
                    506777,
                    572862,
                    231290,
                    163067,
                    559783,
                ],
                t_last=[
                    500664,
                    253389,
                    197470,
                    551774,
                    63812,
                    591021,
                    551748,
                    134829,
                    67055,
                    186422,
                    266952,
                    641121,
                    634694,
                    391331,
                    629796,
                    229076,
                ],
            ),
        },
    ),
    "n4": dict(
        args=dict(
            vocab_size_per_ngram=[1000, 2000, 3000], max_ngram_size=4, n_head_per_ngram=2, layer_ids=[0, 3], seed=7
        ),
        layers={
            0: dict(
                primes=[1009, 1013, 2003, 2011, 3001, 3011],
                mult=[25176803698891589, 36136841410231307, 31242086047143727, 9070610037807277],
                total=320844,
                t0=[179, 920, 670, 418, 2597, 1969],
                t_last=[566, 316, 1788, 624, 1964, 1342],
            ),
            3: dict(
                primes=[1019, 1021, 2017, 2027, 3019, 3023],
                mult=[19084435211586009, 36530731512514981, 1069572777597927, 35088462879739033],
                total=334843,
                t0=[928, 784, 988, 1539, 2591, 2073],
                t_last=[100, 553, 1660, 1530, 1738, 2007],
            ),
        },
    ),
}


def _hasher(**overrides) -> NgramHasher:
    args = dict(
        layer_ids=[1, 4],
        max_ngram_size=3,
        n_head_per_ngram=4,
        vocab_size_per_ngram=[1000, 1500],
        pad_id=0,
        seed=0,
        compressed_vocab_size=300,
    )
    args.update(overrides)
    return NgramHasher(**args)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_matches_official_golden_values(name):
    comp = TokenizerCompression(byte_level_tokens(), vocab_size=384)
    assert comp.compressed_vocab_size == 229 and comp.canonical(257) == 228
    spec = GOLDEN[name]
    hasher = NgramHasher(**spec["args"], pad_id=comp.canonical(257), compressed_vocab_size=comp.compressed_vocab_size)
    ids = comp.compress(torch.tensor([list(TEXT.encode())]))
    for layer_id, gold in spec["layers"].items():
        assert hasher.table_sizes(layer_id) == gold["primes"]
        assert hasher.multipliers(layer_id) == gold["mult"]
        out = hasher.hash(ids, layer_id)
        assert out.shape == (1, len(TEXT), len(gold["primes"]))
        assert out[0, 0].tolist() == gold["t0"]
        assert out[0, -1].tolist() == gold["t_last"]
        assert int(out.sum()) == gold["total"]


def test_deterministic_and_seed_dependent():
    ids = torch.randint(0, 300, (3, 50), generator=torch.Generator().manual_seed(0))
    a, b = _hasher().hash_all(ids), _hasher().hash_all(ids)
    c = _hasher(seed=1).hash_all(ids)
    for layer in (1, 4):
        assert torch.equal(a[layer], b[layer])
        assert not torch.equal(a[layer], c[layer])
        assert torch.equal(a[layer], _hasher().hash(ids, layer))
    assert not torch.equal(a[1], a[4])


def test_ids_in_range_and_dtype():
    hasher = _hasher()
    ids = torch.randint(0, 300, (4, 64), generator=torch.Generator().manual_seed(1))
    for layer in (1, 4):
        out = hasher.hash(ids, layer)
        assert out.dtype == torch.long and out.shape == (4, 64, 8)
        sizes = torch.tensor(hasher.table_sizes(layer))
        assert bool((out >= 0).all()) and bool((out < sizes).all())
        # Every head is used beyond a handful of values (the modulus is applied per head).
        assert all(len(out[..., j].unique()) > 50 for j in range(8))


def test_primes_distinct_and_above_configured_size():
    sizes = ngram_table_sizes(
        layer_ids=[0, 2, 9], max_ngram_size=4, n_head_per_ngram=5, vocab_size_per_ngram=[100, 100, 50]
    )
    flat = [p for layer in (0, 2, 9) for p in sizes[layer]]
    assert len(flat) == 3 * 3 * 5 == len(set(flat))
    assert all(is_prime(p) for p in flat)
    for layer in (0, 2, 9):
        assert all(p >= 100 for p in sizes[layer][:10]) and all(p >= 50 for p in sizes[layer][10:])
    # Heads of one order take increasing primes from the configured size up.
    assert sizes[0][:5] == [101, 103, 107, 109, 113]


def test_is_prime_against_sieve():
    limit = 5000
    sieve = np.ones(limit, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(limit**0.5) + 1):
        sieve[i * i :: i] = False
    assert [n for n in range(limit) if is_prime(n)] == list(np.flatnonzero(sieve))
    assert is_prime(2**61 - 1) and not is_prime(2**61 + 1) and not is_prime(3215031751)


def test_no_int64_overflow_at_the_largest_canonical_id():
    for vocab in (2, 355, 129280, 10**9):
        hasher = _hasher(compressed_vocab_size=vocab, pad_id=0)
        for layer in (1, 4):
            mult = hasher.multipliers(layer)
            assert all(m % 2 == 1 for m in mult)
            assert max(mult) * (vocab - 1) < 2**63
        ids = torch.full((1, 8), vocab - 1)
        assert bool((hasher.hash(ids, 1) >= 0).all())


def test_locality_change_at_s_affects_only_s_to_s_plus_n_minus_1():
    hasher = _hasher()
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    base = hasher.hash(ids, 1)
    for s in (0, 7, 38):
        changed = ids.clone()
        changed[0, s] = (changed[0, s] + 1) % 300
        diff = (hasher.hash(changed, 1) != base).any(dim=-1)[0]
        positions = diff.nonzero().flatten().tolist()
        assert positions == list(range(s, min(s + 3, 40)))


def test_sequence_start_uses_pad():
    hasher = _hasher(pad_id=5)
    a = torch.tensor([[17, 3, 9, 9]])
    b = torch.tensor([[17, 8, 1, 2]])
    assert torch.equal(hasher.hash(a, 1)[:, 0], hasher.hash(b, 1)[:, 0])
    # Position 0 equals hashing (pad, pad, x0) in the middle of a sequence.
    mid = hasher.hash(torch.tensor([[5, 5, 17]]), 1)[:, 2]
    assert torch.equal(hasher.hash(a, 1)[:, 0], mid)


def test_compression_invariance():
    comp = TokenizerCompression(byte_level_tokens())
    hasher = _hasher(compressed_vocab_size=comp.compressed_vocab_size, pad_id=comp.canonical(257))
    upper = torch.tensor([list(b"Hello WORLD\tX")])
    lower = torch.tensor([list(b"hello world x")])
    assert not torch.equal(upper, lower)
    assert torch.equal(hasher.hash(comp.compress(upper), 4), hasher.hash(comp.compress(lower), 4))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_ngram_size - 1"):
        _hasher(vocab_size_per_ngram=[1000])
    with pytest.raises(ValueError, match="pad_id"):
        _hasher(pad_id=300)
    with pytest.raises(ValueError, match="duplicates"):
        _hasher(layer_ids=[1, 1])
    with pytest.raises(KeyError):
        _hasher().hash(torch.zeros(1, 3, dtype=torch.long), 2)


@pytest.mark.parametrize("bad", [-1, -100, 300, 2**40])
def test_canonical_ids_outside_v_prime_are_refused(bad):
    """V' bounds the multipliers so that no product overflows int64: an id at or above V' (or
    negative, which no canonical id is) is refused rather than hashed into wrapped values."""
    hasher = _hasher()  # V' = 300
    ids = torch.tensor([[1, bad, 2]])
    with pytest.raises(ValueError, match=rf"Engram canonical ids must be in \[0, 300\), got {bad}"):
        hasher.hash(ids, 1)
    with pytest.raises(ValueError, match="canonical ids"):
        hasher.hash_all(ids)
    assert hasher.hash(torch.tensor([[0, 299]]), 1).shape == (1, 2, 8)
