"""Engram table sizes: distinct primes just above the configured sizes (torch-free, so that
``olmx train --dry-run`` can show table sizes without importing torch).

Walking layers (in ``layer_ids`` order), then orders 2..N, then heads, each (layer, order,
head) takes the next prime above a running start (``vocab_size_per_ngram[n-2] - 1`` at the
first head of an order, then the previous head's prime) that no earlier one has taken, as the
official ``NgramHashMapping`` of deepseek-ai/Engram does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["is_prime", "ngram_table_sizes"]

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin primality test, exact for every ``n < 3.3e24``."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _next_unused_prime(start: int, used: set[int]) -> int:
    candidate = start + 1
    while candidate in used or not is_prime(candidate):
        candidate += 1
    return candidate


@functools.lru_cache(maxsize=64)
def _table_sizes(
    layer_ids: tuple[int, ...],
    max_ngram_size: int,
    n_head_per_ngram: int,
    vocab_size_per_ngram: tuple[int, ...],
) -> dict[int, tuple[int, ...]]:
    used: set[int] = set()
    sizes: dict[int, tuple[int, ...]] = {}
    for layer_id in layer_ids:
        layer_sizes: list[int] = []
        for order in range(2, max_ngram_size + 1):
            start = vocab_size_per_ngram[order - 2] - 1
            for _ in range(n_head_per_ngram):
                start = _next_unused_prime(start, used)
                used.add(start)
                layer_sizes.append(start)
        sizes[layer_id] = tuple(layer_sizes)
    return sizes


def ngram_table_sizes(
    *,
    layer_ids: Sequence[int],
    max_ngram_size: int,
    n_head_per_ngram: int,
    vocab_size_per_ngram: Sequence[int],
) -> dict[int, list[int]]:
    """The prime table size of every (order, head) of every Engram layer.

    Returns ``{layer_id: [p(order 2, head 1..K), ..., p(order N, head 1..K)]}``. The sizes do
    not depend on the seed, the pad id or the tokenizer, so a model can be built from them
    before any tokenizer is loaded.
    """
    _validate_shape(layer_ids, max_ngram_size, n_head_per_ngram, vocab_size_per_ngram)
    sizes = _table_sizes(
        tuple(int(i) for i in layer_ids),
        int(max_ngram_size),
        int(n_head_per_ngram),
        tuple(int(v) for v in vocab_size_per_ngram),
    )
    return {layer_id: list(s) for layer_id, s in sizes.items()}


def _validate_shape(
    layer_ids: Sequence[int],
    max_ngram_size: int,
    n_head_per_ngram: int,
    vocab_size_per_ngram: Sequence[int],
) -> None:
    if not layer_ids:
        raise ValueError("layer_ids must name at least one layer")
    if len(set(layer_ids)) != len(layer_ids):
        raise ValueError(f"layer_ids={list(layer_ids)} has duplicates")
    if max_ngram_size < 2:
        raise ValueError(f"max_ngram_size={max_ngram_size} must be >= 2")
    if n_head_per_ngram < 1:
        raise ValueError(f"n_head_per_ngram={n_head_per_ngram} must be >= 1")
    if len(vocab_size_per_ngram) != max_ngram_size - 1:
        raise ValueError(
            f"vocab_size_per_ngram has {len(vocab_size_per_ngram)} entries, needs "
            f"max_ngram_size - 1 = {max_ngram_size - 1} (orders 2..{max_ngram_size})"
        )
    if min(vocab_size_per_ngram) < 2:
        raise ValueError(f"vocab_size_per_ngram={list(vocab_size_per_ngram)} entries must be >= 2")
