"""The cache of grammar verdicts (``engine.constraint.Verdicts``) holds digests, not grammars,
and stays within its byte budget, the least recently used going first."""

from __future__ import annotations

import gc
import hashlib
import json
import tracemalloc

import llguidance

from engine import constraint


def schema_grammar(schema: dict[str, str]) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))


def key(grammar: str) -> tuple[str, int, bytes]:
    return ("tokenizer", 49152, hashlib.sha256(grammar.encode()).digest())


def test_bounded_by_bytes_least_recent_first() -> None:
    """Verdicts past ``max_bytes`` evict the least recently used; a read makes one recent."""
    cache = constraint.Verdicts(max_bytes=10 * (constraint.Verdicts.ENTRY_BYTES + 10))
    for i in range(10):
        cache.put(key(f"g{i}"), f"error {i:04d}")  # 10 characters each
    assert len(cache) == 10 and cache.bytes == cache.max_bytes
    assert cache.get(key("g0")) == "error 0000"  # now the most recent
    cache.put(key("g10"), "error 0010")
    assert len(cache) == 10 and cache.bytes <= cache.max_bytes
    assert cache.get(key("g1")) is None and cache.get(key("g0")) == "error 0000"


def test_large_grammars_cost_only_their_digest() -> None:
    """A thousand distinct 1 MB grammars that compile cost their digests: the budget holds."""
    cache = constraint.Verdicts(max_bytes=64 * 1024)
    big = "x" * 1_000_000
    for i in range(1000):
        cache.put(key(big + str(i)), "")
    assert cache.bytes <= 64 * 1024 and len(cache) == 64 * 1024 // constraint.Verdicts.ENTRY_BYTES


def test_a_verdict_larger_than_the_budget_is_not_kept() -> None:
    """An error message longer than the whole budget is answered, not stored."""
    cache = constraint.Verdicts(max_bytes=1000)
    cache.put(key("g"), "e" * 2000)
    assert len(cache) == 0 and cache.bytes == 0


def test_checking_many_large_grammars_keeps_none_of_their_text(tiny_model) -> None:
    """Forty distinct grammars of 1 MB each, checked (and cached): the cache keeps well under a
    megabyte of them (before: every grammar's text, 40 MB, in an lru_cache of 256)."""
    tokenizer, vocab = tiny_model.tokenizer, tiny_model.model.config.vocab_size
    constraint.check_grammar(
        tokenizer, vocab, schema_grammar({"type": "string"})
    )  # builds the tokenizer's view once
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40):
            constraint.check_grammar(
                tokenizer, vocab, schema_grammar({"type": "string", "description": f"{i}" + "x" * 1_000_000})
            )
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000, kept
