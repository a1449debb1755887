"""Engram n-gram hashing: canonical token ids -> per-head table row ids.

Method (DeepSeek, "Conditional Memory via Scalable Lookup", arXiv 2601.07372, §2.2, and the
official ``NgramHashMapping`` in deepseek-ai/Engram ``engram_demo_v1.py``; reimplemented, not
copied, and checked against a re-run of the official code, see the golden test):

* For every Engram layer ``l`` draw ``N`` odd multipliers ``m_j = 2 r_j + 1`` with
  ``r ~ numpy.random.default_rng(seed + 10007 * l).integers(0, half_bound, N, int64)``, where
  ``half_bound = max(1, (int64_max // V') // 2)`` and ``V'`` is the canonical vocabulary size.
  Then ``x * m_j < 2**63`` for every canonical id ``x < V'``: no product overflows int64.
* The suffix n-gram of order ``n`` ending at ``t`` is ``(x_{t-n+1}, ..., x_t)``; positions before
  the sequence start read the canonical pad id. It is mixed as
  ``mix_n = (x_t m_0) XOR (x_{t-1} m_1) XOR ... XOR (x_{t-n+1} m_{n-1})`` (non-negative, since
  every term is).
* Head ``k`` of order ``n`` maps ``mix_n`` to ``mix_n mod p_{l,n,k}``. The moduli are primes:
  walking layers (in ``layer_ids`` order), then orders 2..N, then heads, each takes the next
  prime above a running start (``vocab_size_per_ngram[n-2] - 1`` at the first head of an order,
  then the previous head's prime) that no earlier (layer, order, head) has taken. Every table
  therefore has its own prime size just above the configured size.

Everything after the multiplier draw is integer torch code, so it runs on the training device,
bit-identical to the numpy reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .compression import check_id_range
from .primes import is_prime, ngram_table_sizes

__all__ = ["NgramHasher", "is_prime", "ngram_table_sizes"]

_LAYER_SEED_STRIDE = 10007


class NgramHasher:
    """Multi-head hashing of suffix n-grams of canonical token ids, for all Engram layers.

    Table sizes and ids are identical to the official ``NgramHashMapping`` given the same
    arguments (its ``engram_vocab_size`` is ``vocab_size_per_ngram``; its tokenizer step is
    :class:`~olmx_plugins.layers.engram.compression.TokenizerCompression`, applied before this).

    :param layer_ids: The Engram layers (0-based block indices). Their order matters: it is the
        order in which the primes are drawn.
    :param max_ngram_size: ``N``; n-gram orders 2..N are hashed.
    :param n_head_per_ngram: ``K``, hash heads per order.
    :param vocab_size_per_ngram: Configured table size per order (``N - 1`` entries); each head
        gets the next unused prime above it.
    :param pad_id: The canonical id read at positions before the sequence start.
    :param seed: Base seed of the multipliers.
    :param compressed_vocab_size: ``V'``, the number of canonical ids; every id passed to
        :meth:`hash` must be in ``[0, V')`` (others are refused, see
        :func:`~olmx_plugins.layers.engram.compression.check_id_range`).
    """

    def __init__(
        self,
        *,
        layer_ids: Sequence[int],
        max_ngram_size: int,
        n_head_per_ngram: int,
        vocab_size_per_ngram: Sequence[int],
        pad_id: int,
        seed: int,
        compressed_vocab_size: int,
    ):
        if compressed_vocab_size < 1:
            raise ValueError(f"compressed_vocab_size={compressed_vocab_size} must be >= 1")
        if not 0 <= pad_id < compressed_vocab_size:
            raise ValueError(f"pad_id={pad_id} must be a canonical id in [0, {compressed_vocab_size})")
        self.layer_ids = [int(i) for i in layer_ids]
        self.max_ngram_size = int(max_ngram_size)
        self.n_head_per_ngram = int(n_head_per_ngram)
        self.vocab_size_per_ngram = [int(v) for v in vocab_size_per_ngram]
        self.pad_id = int(pad_id)
        self.seed = int(seed)
        self.compressed_vocab_size = int(compressed_vocab_size)
        self._sizes = ngram_table_sizes(
            layer_ids=self.layer_ids,
            max_ngram_size=self.max_ngram_size,
            n_head_per_ngram=self.n_head_per_ngram,
            vocab_size_per_ngram=self.vocab_size_per_ngram,
        )

        half_bound = max(1, (int(np.iinfo(np.int64).max) // self.compressed_vocab_size) // 2)
        self._multipliers: dict[int, list[int]] = {}
        for layer_id in self.layer_ids:
            rng = np.random.default_rng(self.seed + _LAYER_SEED_STRIDE * layer_id)
            r = rng.integers(0, half_bound, size=(self.max_ngram_size,), dtype=np.int64)
            self._multipliers[layer_id] = [int(v) * 2 + 1 for v in r]

    @property
    def num_heads(self) -> int:
        """``(N - 1) * K``: the number of table ids per token and layer."""
        return (self.max_ngram_size - 1) * self.n_head_per_ngram

    def table_sizes(self, layer_id: int) -> list[int]:
        """Prime size of each (order, head) table of ``layer_id``, order-major then head."""
        return list(self._sizes[self._check_layer(layer_id)])

    def multipliers(self, layer_id: int) -> list[int]:
        """The ``N`` odd multipliers of ``layer_id`` (offset 0 = current token first)."""
        return list(self._multipliers[self._check_layer(layer_id)])

    def hash(self, canonical_ids: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Hash ids of one layer: ``LongTensor[B, T] -> LongTensor[B, T, (N-1)*K]``.

        Column ``(n - 2) * K + k`` holds head ``k`` of order ``n``; its values lie in
        ``[0, table_sizes(layer_id)[(n - 2) * K + k])``.
        """
        self._check_layer(layer_id)
        return self._hash_layer(self._shifts(canonical_ids), layer_id)

    def hash_all(self, canonical_ids: torch.Tensor, layer_ids: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
        """:meth:`hash` for every layer (or those of ``layer_ids``), sharing the shifted copies of
        the input."""
        layer_ids = self.layer_ids if layer_ids is None else [self._check_layer(i) for i in layer_ids]
        shifts = self._shifts(canonical_ids)
        return {layer_id: self._hash_layer(shifts, layer_id) for layer_id in layer_ids}

    def _check_layer(self, layer_id: int) -> int:
        if layer_id not in self._multipliers:
            raise KeyError(f"layer {layer_id} is not an Engram layer (layer_ids={self.layer_ids})")
        return layer_id

    def _shifts(self, canonical_ids: torch.Tensor) -> list[torch.Tensor]:
        if canonical_ids.dim() != 2:
            raise ValueError(f"canonical_ids must be [B, T], got shape {tuple(canonical_ids.shape)}")
        # Beyond V' a product can overflow int64 (the multipliers' bound); negative ids are not
        # canonical ids. The official code never passes either (it clips to the tokenizer).
        check_id_range(canonical_ids, self.compressed_vocab_size, "Engram canonical ids")
        x = canonical_ids.long()
        shifts = [x]
        for k in range(1, self.max_ngram_size):
            # (F.pad on int64 is ~100x slower on CPU than this copy, torch 2.13.)
            shifted = x.new_full(x.shape, self.pad_id)
            shifted[:, k:] = x[:, : max(x.shape[1] - k, 0)]
            shifts.append(shifted)
        return shifts

    def _hash_layer(self, shifts: list[torch.Tensor], layer_id: int) -> torch.Tensor:
        mult = self._multipliers[layer_id]
        sizes = self._sizes[layer_id]
        mix = shifts[0] * mult[0]
        heads = []
        for order in range(2, self.max_ngram_size + 1):
            mix = torch.bitwise_xor(mix, shifts[order - 1] * mult[order - 1])
            first = (order - 2) * self.n_head_per_ngram
            # One remainder per head with a Python-int divisor: ~100x faster on CPU than a
            # broadcast remainder by a tensor of moduli (torch 2.13).
            heads += [mix % p for p in sizes[first : first + self.n_head_per_ngram]]
        return torch.stack(heads, dim=-1)
