"""Over HTTP, a blob or tail whose safetensors header is malformed in any way (``tests.blob_damage``)
is a miss from there on with the uncached answer, never a failed request: the file is dropped,
counted, and the next request stores it again and hits. (Every kind on the store's API alone:
``tests/unit/store/test_malformed_blobs.py``.)"""

from __future__ import annotations

import pytest

from hashing import block_hashes, tail_hash
from tests.blob_damage import MALFORMED
from tests.helpers import random_tokens

PROMPT = random_tokens(3 * 128 + 20, seed=39)


@pytest.fixture
def settings(settings):
    """Blobs on disk are what these tests damage: no RAM tier in front of them."""
    return settings.model_copy(update={"ram_cache_bytes": 0})


def test_every_malformed_block_or_tail_is_a_miss_with_the_uncached_answer(cached, cold) -> None:
    """For each malformation, of block 1 then of the prompt's tail: answered (200) with the cold
    server's tokens, reusing only what comes before it; the file is gone; one failure counted; the
    next request, after the re-save, reuses all but the last token again."""
    expected = cold.complete(PROMPT).key
    assert cached.complete(PROMPT).key == expected
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    hashes = block_hashes(PROMPT, namespace)
    tail = tail_hash(hashes[2], PROMPT[3 * 128 :])
    blobs = cached.cache.parts.blobs
    for name, damage in MALFORMED.items():
        for what, blob, reused in (("block 1", hashes[1], 128), ("the tail", tail, 3 * 128)):
            path = blobs.path(namespace, blob)
            bad = damage(path.read_bytes())
            path.write_bytes(bad)
            failures = cached.cache.admin.stats().verification_failures
            damaged = cached.complete(PROMPT)
            assert (damaged.status, damaged.cached_tokens) == (200, reused), (name, what)
            assert damaged.key == expected, (name, what)
            assert cached.cache.admin.stats().verification_failures == failures + 1, (name, what)
            assert not path.exists() or path.read_bytes() != bad, (name, what)  # dropped (or stored again)
            cached.flush()  # the request stored it again, in the background
            healed = cached.complete(PROMPT)
            assert (healed.cached_tokens, healed.key) == (len(PROMPT) - 1, expected), (name, what)
            cached.flush()  # NOTE: a block still being saved would serve the next request
