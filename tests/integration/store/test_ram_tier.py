"""The RAM tier: hot blocks skip the disk, yet the index alone decides what may be served."""

from __future__ import annotations

import threading

import pytest

from tests.api import Api
from tests.helpers import random_tokens

PROMPT = random_tokens(3 * 128 + 20, seed=61)


@pytest.fixture
def settings(settings):
    """No garbage collection during these tests: it would drop entries whose blobs are gone."""
    return settings.model_copy(update={"gc_interval": 3600})


def test_hot_blocks_are_served_without_reading_their_blobs(cached, cold, settings) -> None:
    """Every blob deleted after the first request: the repeat still hits all 3 blocks, from RAM,
    and answers exactly like the cold server."""
    cached.complete(PROMPT)
    cached.flush()
    for blob in settings.blob_root.rglob("*.safetensors"):
        blob.unlink()
    result = cached.complete(PROMPT)
    assert result.cached_tokens == len(PROMPT) - 1  # the 3 blocks, then 19 of the prompt's tail
    assert cached.cache.admin.stats().blocks_from_ram == 3
    assert cached.cache.admin.stats().tails_hit == 1  # the tail from RAM too, its blob gone
    assert result.key == cold.complete(PROMPT).key


def test_blocks_read_from_disk_enter_ram(settings, tiny_model, serve) -> None:
    """A fresh process (empty RAM tier) reads the blobs once; its next hit comes from RAM."""
    with serve(settings, tiny_model) as first:
        Api(first).complete(PROMPT)
        Api(first).flush()
    with serve(settings, tiny_model) as second:
        api = Api(second)
        assert api.complete(PROMPT).cached_tokens == len(PROMPT) - 1  # 3 blocks, then a tail
        assert api.cache.admin.stats().blocks_from_ram == 0
        assert api.complete(PROMPT).cached_tokens == len(PROMPT) - 1
        api.flush()  # NOTE: the completion's tail, already indexed, enters RAM as the writer meets it
        # 3 blocks and 2 tails (the prompt's, read from disk, and its completion's)
        assert api.cache.admin.stats().blocks_from_ram == 3 and len(api.cache.parts.ram) == 3 + 2


def test_ram_never_serves_a_block_the_index_dropped(cached, redis_client, key_prefix) -> None:
    """Index entries removed behind the process's back (another replica's eviction, an expiry):
    the blocks are still in RAM, yet the next request is a miss."""
    cached.complete(PROMPT)
    cached.flush()
    assert len(cached.cache.parts.ram) == 3 + 2  # 3 blocks, the prompt's tail, its completion's
    redis_client.delete(*redis_client.scan_iter(match=f"{key_prefix}*:b:*"))
    assert cached.complete(PROMPT).cached_tokens == 0
    assert cached.cache.admin.stats().blocks_from_ram == 0


def test_a_request_right_after_another_hits_while_the_writer_is_behind(cached, cold, settings) -> None:
    """The disk writer is held up: the repeat still hits all 3 blocks (from the blocks being
    saved), answers like cold, and the blocks reach the disk once the writer resumes."""
    gate = threading.Event()
    assert cached.cache.writer.enqueue(gate.wait)  # the writer is busy until the gate opens
    cached.complete(PROMPT)
    result = cached.complete(PROMPT)
    on_disk = list(settings.blob_root.rglob("*.safetensors"))
    gate.set()
    cached.flush()
    assert result.cached_tokens == len(PROMPT) - 1 and not on_disk  # the tail is pending too
    assert result.key == cold.complete(PROMPT).key
    # 3 blocks, the prompt's tail and its completion's (the repeat's are the same ones)
    assert len(list(settings.blob_root.rglob("*.safetensors"))) == 3 + 2 and not cached.cache.writer.pending
