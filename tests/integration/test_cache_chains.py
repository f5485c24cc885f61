"""Kind 6, chains: a missing middle block ends the prefix; later blocks never count or load."""

from __future__ import annotations

import pytest

from hashing import block_hashes
from tests.integration.conftest import random_tokens

PROMPT = random_tokens(4 * 128 + 10, seed=11)


@pytest.fixture
def settings(settings):
    """Blobs on disk are what these tests damage: no RAM tier in front of them."""
    return settings.model_copy(update={"ram_cache_bytes": 0})


@pytest.mark.parametrize("missing", ["index-entry", "blob"])
def test_missing_middle_block_ends_the_prefix(cached, cold, settings, redis_client, missing) -> None:
    """Block 1 of 4 gone: 128 cached tokens, only block 0 loaded, answer identical to cold."""
    cached.complete(PROMPT)
    cached.flush()
    namespace = cached.engine.namespace("default")
    block = block_hashes(PROMPT, namespace)[1]
    if missing == "index-entry":
        redis_client.delete(cached.cache.index.block_key(namespace, block))
    else:
        (settings.blob_root / cached.cache.blobs.relative_path(namespace, block)).unlink()
    loaded = cached.cache.stats.blocks_loaded

    result = cached.complete(PROMPT)
    assert result.cached_tokens == 128
    assert cached.cache.stats.blocks_loaded == loaded + 1  # blocks 2 and 3 were never read
    assert result.key == cold.complete(PROMPT).key
