"""The cache of grammar verdicts (``engine.constraint.Verdicts``) holds digests, not grammars,
and stays within its byte budget, the least recently used going first."""

from __future__ import annotations

import hashlib

from engine.constraint import Verdicts


def key(grammar: str) -> tuple[str, int, bytes]:
    return ("tokenizer", 49152, hashlib.sha256(grammar.encode()).digest())


def test_bounded_by_bytes_least_recent_first() -> None:
    """Verdicts past ``max_bytes`` evict the least recently used; a read makes one recent."""
    cache = Verdicts(max_bytes=10 * (Verdicts.ENTRY_BYTES + 10))
    for i in range(10):
        cache.put(key(f"g{i}"), f"error {i:04d}")  # 10 characters each
    assert len(cache) == 10 and cache.bytes == cache.max_bytes
    assert cache.get(key("g0")) == "error 0000"  # now the most recent
    cache.put(key("g10"), "error 0010")
    assert len(cache) == 10 and cache.bytes <= cache.max_bytes
    assert cache.get(key("g1")) is None and cache.get(key("g0")) == "error 0000"


def test_large_grammars_cost_only_their_digest() -> None:
    """A thousand distinct 1 MB grammars that compile cost their digests: the budget holds."""
    cache = Verdicts(max_bytes=64 * 1024)
    big = "x" * 1_000_000
    for i in range(1000):
        cache.put(key(big + str(i)), "")
    assert cache.bytes <= 64 * 1024 and len(cache) == 64 * 1024 // Verdicts.ENTRY_BYTES


def test_a_verdict_larger_than_the_budget_is_not_kept() -> None:
    """An error message longer than the whole budget is answered, not stored."""
    cache = Verdicts(max_bytes=1000)
    cache.put(key("g"), "e" * 2000)
    assert len(cache) == 0 and cache.bytes == 0
