"""What a request just computed serves the next one at once, while the writer is still saving it:
an agent sends its next step the moment a turn ends, long before the blobs are on disk.

The writer is held up deterministically (a job that waits on a gate, ahead of every save), so
nothing here depends on the machine's speed: the lookups run while every block and tail is
still pending, or while the writer publishes them in the middle of a lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from hashing import BLOCK_SIZE
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.memory.index import MemoryIndex
from store.index.redis.index import RedisIndex
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, kv, random_tokens

IDS = list(range(2 * BLOCK_SIZE + 40))  # two full blocks, then a 40-token tail


@pytest.fixture(params=["memory", "redis"])
def cache(request, redis_client, key_prefix, tmp_path) -> BlockCache:
    index = MemoryIndex() if request.param == "memory" else RedisIndex(redis_client, key_prefix)
    return BlockCache(index, FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=600, ram_bytes=0))


@pytest.fixture
def held(cache: BlockCache) -> Iterator[threading.Event]:
    """The writer busy until the gate is set (set at the end in any case)."""
    gate = threading.Event()
    assert cache.writer.enqueue(gate.wait)
    yield gate
    gate.set()
    assert cache.flush(HANG_S)


def save(cache: BlockCache) -> tuple[torch.Tensor, torch.Tensor]:
    """IDS' two blocks and its tail handed to the writer (as a finished request hands them)."""
    cache.save(NS, IDS, 0, *kv(2))
    g = torch.Generator().manual_seed(3)
    shape = (SPEC.num_layers, SPEC.num_kv_heads, 40, SPEC.head_dim)
    key, value = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    cache.save_tail(NS, IDS, key, value)
    return key, value


def test_a_pending_tail_serves_its_longest_common_prefix(cache, held) -> None:
    """Nothing is on disk yet: a prompt that leaves the tail after k of its tokens gets the two
    pending blocks and exactly those k tokens of the pending tail."""
    key, _ = save(cache)
    for k in (1, 17, 38, 39, 40):
        prompt = [*IDS[: 2 * BLOCK_SIZE + k], 999, *IDS[2 * BLOCK_SIZE + k :], 5]
        match = cache.lookup(NS, prompt)
        assert (match.num_blocks, match.tail_tokens) == (2, k), k
        assert torch.equal(match.tail.key[:, :, :k], key[:, :, :k]), k
    assert not list(cache.parts.blobs.root.rglob("*.safetensors"))


def test_what_is_published_during_a_lookup_is_still_served(cache, held, monkeypatch) -> None:
    """The writer publishes the blocks and the tail (and stops holding them) right after the
    index's round trip has found none of them: the lookup still serves all of them, from the copy
    it took of the pending ones before asking the index."""
    key, _ = save(cache)
    index, match = cache.parts.index, cache.parts.index.match

    def then_published(*args, **kwargs):
        found = match(*args, **kwargs)
        held.set()
        assert cache.flush(HANG_S) and len(cache.writer.pending) == 0
        return found

    monkeypatch.setattr(index, "match", then_published)
    found = cache.lookup(NS, [*IDS[: 2 * BLOCK_SIZE + 25], 999])
    assert (found.num_blocks, found.tail_tokens) == (2, 25)
    assert torch.equal(found.tail.key[:, :, :25], key[:, :, :25])
    monkeypatch.undo()
    assert cache.lookup(NS, [*IDS, 1]).num_tokens == len(IDS)  # and from the index since


PROMPT = random_tokens(3 * BLOCK_SIZE + 20, seed=46)


def next_step(answer: list[int], keep: int) -> list[int]:
    """The next step's prompt: the turn's prompt, its answer as the history renders it (the
    first ``keep`` tokens as generated, then others), then a tool's result."""
    other = [10 + (t - 9) % 380 for t in answer[keep : keep + 2]]  # another id of the vocabulary
    rendered = answer[:keep] + other if keep < len(answer) else answer
    return PROMPT + rendered + random_tokens(30, seed=7)


@pytest.mark.parametrize("keep", [20, 11, 1])
def test_a_step_sent_as_its_turn_ends_reuses_the_answer(cached, cold, settings, keep) -> None:
    """Over HTTP, the writer held up: the turn's answer (20 tokens, inside the block after the
    prompt's three) is not on disk when the next step comes, yet the step reuses the prompt and
    the answer's first ``keep`` tokens (all 20; or up to where the history renders it with other
    tokens), and answers exactly as the cold server does."""
    gate = threading.Event()
    assert cached.cache.writer.enqueue(gate.wait)
    try:
        turn = cached.complete(PROMPT, max_tokens=20)
        assert len(turn.token_ids) == 20  # the scaled tiny model never emits EOS this early
        step = next_step(turn.token_ids, keep)
        result = cached.complete(step)
        on_disk = list(settings.blob_root.rglob("*.safetensors"))
    finally:
        gate.set()
    cached.flush()
    assert not on_disk
    assert (result.prompt_tokens, result.cached_tokens) == (len(step), len(PROMPT) + keep)
    assert result.key == cold.complete(step).key
