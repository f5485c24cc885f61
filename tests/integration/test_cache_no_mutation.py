"""Kind 4, cached data is never mutated by later requests that extend or cut a prefix."""

from __future__ import annotations

import hashlib

from tests.integration.conftest import random_tokens


def digests(blob_root) -> dict[str, str]:
    return {
        str(p.relative_to(blob_root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in blob_root.rglob("*.safetensors")
    }


def test_blobs_of_a_prefix_stay_byte_for_byte(cached, cold, settings) -> None:
    """P, P+S1, P+S2, P+S1 again, a truncation of P+S1: all identical to cold; P's files unchanged."""
    p = random_tokens(300, seed=1)
    s1, s2 = random_tokens(200, seed=2), random_tokens(150, seed=3)
    cached.complete(p)
    cached.flush()
    p_blobs = digests(settings.blob_root)
    assert len(p_blobs) == 2  # 300 tokens + 8 generated: two full blocks

    for prompt in (p, p + s1, p + s2, p + s1, (p + s1)[:420]):
        warm = cached.complete(prompt)
        cached.flush()
        assert warm.key == cold.complete(prompt).key, len(prompt)
    after = digests(settings.blob_root)
    assert {name: after[name] for name in p_blobs} == p_blobs
