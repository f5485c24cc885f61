"""The prefix-reuse story, as a client sees it (tiny model, real Redis and blob directory, real
HTTP): what is reused where, exactly, and that a cached answer is always the cold answer.

Each test is a short story with numbered steps; the numbers are exact (``cached_tokens`` is
``min(128 k, n - 1)`` for k cached blocks, see ``hashing.reusable_tokens``, plus what a tail
served, ``hashing.tails``). The cold server (``--no-cache``) gives the reference answers.
"""

from __future__ import annotations

import hashlib
import math

import pytest

from hashing import block_hashes
from tests.api import Api
from tests.helpers import random_tokens

LENGTHS = [127, 128, 129, 255, 256, 257, 383, 384, 385, 1024, 1025]


@pytest.mark.parametrize("n", LENGTHS)
def test_block_boundaries_report_exact_cached_tokens(cached, cold, n) -> None:
    """Second send of an n-token prompt: cached_tokens = n - 1, whatever n."""
    prompt = random_tokens(n, seed=n)
    # 1. First send: nothing cached; its full blocks and its tail are stored in the background.
    first = cached.complete(prompt)
    cached.flush()
    # 2. Second send: every full block hits, then the tail, but the last prompt token is always
    #    computed.
    second = cached.complete(prompt)
    reference = cold.complete(prompt)
    assert first.cached_tokens == 0
    assert second.cached_tokens == n - 1
    assert second.prompt_tokens == n
    # 3. Both answers are the cold answer.
    assert first.key == second.key == reference.key
    assert len(second.token_ids) > 0


def test_every_repeated_prompt_reuses_all_but_its_last_token(cached, cold) -> None:
    """For every length n from 2 to 300: the second send reports n - 1 cached tokens, and both
    answers are the cold server's, token for token. (Each prompt starts with a token of its own:
    a tail serves any prompt the tokens they share, so random prompts sharing a first token would
    hit it.)"""
    for n in range(2, 301):
        prompt = [8 + n, *random_tokens(n - 1, seed=10_000 + n)]
        first = cached.complete(prompt, max_tokens=4)
        cached.flush()
        second = cached.complete(prompt, max_tokens=4)
        assert (first.cached_tokens, second.cached_tokens) == (0, n - 1), n
        assert first.key == second.key == cold.complete(prompt, max_tokens=4).key, n


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("n", [128, 256, 384])
def test_an_exact_repeat_prefills_one_token(cached, cold, n, stream) -> None:
    """Repeat of an n-token prompt (n = 128k): n - 1 cached, one token prefilled, each token fed
    once, a non-empty completion identical to cold, and the worker keeps serving."""
    prompt = random_tokens(n, seed=n)
    cached.complete(prompt, stream=stream)
    cached.flush()
    before = dict(vars(cached.engine.stats()))
    repeat = cached.complete(prompt, stream=stream)
    after = vars(cached.engine.stats())
    reference = cold.complete(prompt, stream=stream)

    assert repeat.cached_tokens == n - 1
    assert after["prefill_tokens"] - before["prefill_tokens"] == 1
    # every generated token is fed exactly once (the last as the answer ends: the next turn holds it)
    assert after["decode_tokens"] - before["decode_tokens"] == len(repeat.token_ids)
    assert repeat.token_ids and repeat.key == reference.key
    assert cached.complete(random_tokens(40, seed=1)).status == 200  # still serving


PREFIX = random_tokens(256, seed=7)


@pytest.mark.parametrize("suffix_len", [1, 2, 127, 128, 129, 300])
def test_any_suffix_on_a_cached_prefix_answers_like_cold(cached, cold, suffix_len) -> None:
    """A cached 256-token prefix plus a suffix: identical completion, first-token
    log-probabilities within 1e-4 of cold."""
    cached.complete(PREFIX)
    cached.flush()
    prompt = PREFIX + random_tokens(suffix_len, seed=1000 + suffix_len)
    warm, reference = cached.complete(prompt), cold.complete(prompt)
    assert warm.cached_tokens == 256
    assert warm.key == reference.key
    assert warm.first_logprobs.keys() == reference.first_logprobs.keys()
    for token, logprob in reference.first_logprobs.items():
        assert math.isclose(warm.first_logprobs[token], logprob, abs_tol=1e-4)


def digests(blob_root) -> dict[str, str]:
    return {
        str(p.relative_to(blob_root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in blob_root.rglob("*.safetensors")
    }


def test_stored_blocks_are_never_rewritten(cached, cold, settings) -> None:
    """P, P+S1, P+S2, P+S1 again, a truncation of P+S1: all identical to cold; P's files unchanged."""
    p = random_tokens(300, seed=1)
    s1, s2 = random_tokens(200, seed=2), random_tokens(150, seed=3)
    # 1. P (300 tokens + 8 generated) stores two full blocks and two tails (after the prompt,
    #    after the completion).
    cached.complete(p)
    cached.flush()
    p_blobs = digests(settings.blob_root)
    assert len(p_blobs) == 4
    # 2. Prompts that extend or cut P reuse its blocks and store their own.
    for prompt in (p, p + s1, p + s2, p + s1, (p + s1)[:420]):
        warm = cached.complete(prompt)
        cached.flush()
        assert warm.key == cold.complete(prompt).key, len(prompt)
    # 3. P's blobs are byte for byte what they were.
    after = digests(settings.blob_root)
    assert {name: after[name] for name in p_blobs} == p_blobs


CHAIN = random_tokens(4 * 128 + 10, seed=11)


@pytest.fixture
def no_ram_tier(settings):
    """Blobs on disk are what the chain test damages: no RAM tier in front of them."""
    return settings.model_copy(update={"ram_cache_bytes": 0})


@pytest.mark.parametrize("missing", ["index-entry", "blob"])
def test_a_missing_middle_block_ends_the_prefix(no_ram_tier, tiny_model, serve, cold, redis_client, missing):
    """Block 1 of 4 gone: 128 cached tokens, only block 0 loaded, the answer identical to cold."""
    with serve(no_ram_tier, tiny_model) as server:
        cached = Api(server)
        # 1. Store blocks 0..3.
        cached.complete(CHAIN)
        cached.flush()
        # 2. Remove block 1: its index entry, or its blob.
        namespace = cached.engine.loaded.namespace("default")
        block = block_hashes(CHAIN, namespace)[1]
        if missing == "index-entry":
            redis_client.delete(cached.cache.parts.index.block_key(namespace, block))
        else:
            cached.cache.parts.blobs.path(namespace, block).unlink()
        loaded = cached.cache.admin.stats().blocks_loaded
        # 3. The prefix ends at block 1; blocks 2 and 3 are never read.
        result = cached.complete(CHAIN)
        assert result.cached_tokens == 128
        assert cached.cache.admin.stats().blocks_loaded == loaded + 1
        assert result.key == cold.complete(CHAIN).key
