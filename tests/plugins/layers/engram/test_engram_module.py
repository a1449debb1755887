"""The Engram module (replicated table): shapes, gate, convolution, causality, sparse grads."""

import pytest
import torch

from olmx_plugins.layers.engram.hashing import NgramHasher
from olmx_plugins.layers.engram.module import Engram

D_MODEL, N, K, VOCAB = 32, 3, 4, 50


def _setup(zero_init_conv=True, seed=0):
    torch.manual_seed(seed)
    hasher = NgramHasher(
        layer_ids=[2],
        max_ngram_size=N,
        n_head_per_ngram=K,
        vocab_size_per_ngram=[200, 300],
        pad_id=0,
        seed=0,
        compressed_vocab_size=VOCAB,
    )
    engram = Engram(
        d_model=D_MODEL,
        table_sizes=hasher.table_sizes(2),
        max_ngram_size=N,
        n_head_per_ngram=K,
        n_embed_per_ngram=16,
        zero_init_conv=zero_init_conv,
    )
    return hasher, engram


def _inputs(batch=2, seq=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (batch, seq), generator=g), torch.randn(batch, seq, D_MODEL, generator=g))


def test_shapes_and_gate_strictly_inside_unit_interval():
    hasher, engram = _setup()
    ids, hidden = _inputs()
    hash_ids = hasher.hash(ids, 2)
    assert hash_ids.shape == (2, 40, (N - 1) * K)
    e = engram.embed(hash_ids)
    assert e.shape == (2, 40, (N - 1) * 16)
    for scale in (1.0, 1e4):
        gate = engram.gate(hidden * scale, e * scale)
        assert gate.shape == (2, 40, 1)
        assert bool((gate > 0).all()) and bool((gate < 1).all())
    # Unit-gain RMSNorm outputs have norm sqrt(d), so the score is at most sqrt(d) and the
    # signed square root at most d**0.25: the gate never saturates in float32.
    bound = torch.sigmoid(torch.tensor(D_MODEL**0.25)).item()
    assert float(engram.gate(hidden, e).detach().max()) <= bound
    assert engram(hidden, hash_ids).shape == hidden.shape


def test_zero_init_conv_output_is_gated_value():
    hasher, engram = _setup(zero_init_conv=True)
    assert bool((engram.conv_weight == 0).all())
    ids, hidden = _inputs()
    hash_ids = hasher.hash(ids, 2)
    e = engram.embed(hash_ids)
    expected = engram.gate(hidden, e) * engram.value_proj(e)
    assert torch.equal(engram(hidden, hash_ids), expected)


def test_signed_sqrt_gate_formula():
    _, engram = _setup()
    ids, hidden = _inputs(batch=1, seq=5)
    e = torch.randn(1, 5, engram.d_mem)
    k = engram.key_proj(e)
    eps = torch.finfo(torch.float32).eps  # the demo's nn.RMSNorm() (eps=None)
    rms = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # noqa: E731
    score = (rms(k) * rms(hidden)).sum(-1) / D_MODEL**0.5
    expected = torch.sigmoid(score.sign() * score.abs().sqrt())
    torch.testing.assert_close(engram.gate(hidden, e).squeeze(-1), expected)


@pytest.mark.parametrize("s", [0, 13, 30])
def test_causal_with_receptive_field_of_12_tokens(s):
    hasher, engram = _setup(zero_init_conv=False)
    assert engram.receptive_field == (4 - 1) * N + N == 12
    ids, hidden = _inputs(seq=48)
    base = engram(hidden, hasher.hash(ids, 2))
    changed_ids = ids.clone()
    changed_ids[:, s] = (changed_ids[:, s] + 7) % VOCAB
    out = engram(hidden, hasher.hash(changed_ids, 2))
    differs = (out != base).any(dim=-1).any(dim=0)
    assert torch.equal(out[:, :s], base[:, :s])
    assert torch.equal(out[:, s + 12 :], base[:, s + 12 :])
    assert bool(differs[s]) and bool(differs[min(s + 11, 47)])
    # A change in the hidden state at s reaches s .. s + (kernel - 1) * N.
    changed_hidden = hidden.clone()
    changed_hidden[:, s] += 1.0
    out = engram(changed_hidden, hasher.hash(ids, 2))
    positions = (out != base).any(dim=-1).any(dim=0).nonzero().flatten().tolist()
    assert positions[0] == s and positions[-1] <= s + 9


def test_gradients_only_on_looked_up_rows():
    hasher, engram = _setup(zero_init_conv=False)
    ids, hidden = _inputs()
    hash_ids = hasher.hash(ids, 2)
    engram(hidden, hash_ids).square().sum().backward()
    touched = engram.table.rows(hash_ids).unique()
    nonzero = engram.table.weight.grad.abs().sum(dim=1).nonzero().flatten()
    assert torch.equal(nonzero, touched)
    assert touched.numel() < engram.table.num_rows / 2


def test_table_offsets_pack_heads():
    hasher, engram = _setup()
    sizes = hasher.table_sizes(2)
    assert engram.table.num_rows == sum(sizes)
    ids = torch.zeros(1, 1, len(sizes), dtype=torch.long)
    rows = engram.table.rows(ids).flatten().tolist()
    assert rows == [sum(sizes[:j]) for j in range(len(sizes))]
    e = engram.table(ids)
    assert torch.equal(e[0, 0], engram.table.weight[rows])


def test_rejects_inconsistent_sizes():
    with pytest.raises(ValueError, match="table sizes"):
        Engram(d_model=8, table_sizes=[11, 13], max_ngram_size=3, n_head_per_ngram=2, n_embed_per_ngram=4)
    with pytest.raises(ValueError, match="divisible"):
        Engram(d_model=8, table_sizes=[11, 13, 17, 19], max_ngram_size=3, n_head_per_ngram=2, n_embed_per_ngram=5)


def test_compute_dtype_is_autocasts_else_the_projections():
    """The dtype sharded tables move their rows in (``EngramTable(wire_dtype=...)``)."""
    _, engram = _setup()
    cpu = torch.device("cpu")
    assert engram.compute_dtype(cpu) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert engram.compute_dtype(cpu) == torch.bfloat16
    engram.value_proj.to(torch.bfloat16)  # as FSDP gathers it under bf16
    assert engram.compute_dtype(cpu) == torch.bfloat16
