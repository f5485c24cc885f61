"""Tails (``hashing.tails``): reuse to the token, with every cache promise blocks keep.

Tiny random Llama, float32, real Redis and blob store. A tail of every length 1-127, after 0, 1
and 2 blocks, serves exactly its tokens (logits within 1e-4 of a cold prefill, same greedy
tokens); a repeated prompt of any length reuses all but its last token; a tail never crosses a
namespace; a damaged tail is a miss and is dropped.
"""

from __future__ import annotations

import pytest
import torch

from engine.requests import GenerationRequest, PrefillDone
from engine.worker import Engine
from hashing import BLOCK_SIZE
from tests.helpers import GREEDY, HANG_S, engine_events, prefill_prompt, random_tokens
from tests.helpers import run_engine as run


@pytest.fixture
def engines(tiny_model, make_cache):
    cached, cold = Engine(tiny_model, make_cache(tiny_model)), Engine(tiny_model, None)
    yield cached, cold
    cached.close()
    cold.close()


def flushed(engine: Engine) -> None:
    assert engine.cache is not None and engine.cache.flush(HANG_S)


@pytest.mark.parametrize("blocks", [0, 1, 2])
def test_every_tail_length_serves_exactly_its_tokens(engines, blocks) -> None:
    """A prompt ending 1-127 tokens after ``blocks`` blocks stores its tail; a longer prompt that
    continues it reuses every one of those tokens, with the cold prompt's logits."""
    cached, cold = engines
    for length in range(1, BLOCK_SIZE):
        prompt = tuple(random_tokens(blocks * BLOCK_SIZE + length + 3, seed=1000 * blocks + length))
        stored = prompt[: blocks * BLOCK_SIZE + length]
        run(cached, stored, max_tokens=1)
        flushed(cached)
        warm_logits, reused, fed = prefill_prompt(cached, prompt)
        cold_logits, _, _ = prefill_prompt(cold, prompt)
        assert (reused, fed) == (len(stored), len(prompt)), length
        assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0), length


def test_a_tail_serves_all_but_its_last_token(engines) -> None:
    """A repeated prompt ends where its stored tail ends: it reuses all of it but the last token,
    and answers as the cold engine does."""
    cached, cold = engines
    for n in (2, 3, 64, 127, 129, 200, 255):
        prompt = tuple(random_tokens(n, seed=n))
        first = run(cached, prompt)
        flushed(cached)
        again = run(cached, prompt)
        assert first[1] <= again[1] == n - 1, n
        assert again[0] == run(cold, prompt)[0], n


def test_a_completion_tail_serves_the_next_turn(engines) -> None:
    """Prompt + completion is stored to its last token (fed once the answer is out): the next
    turn, which continues it, reuses all of it."""
    cached, cold = engines
    prompt = tuple(random_tokens(250))
    completion, _, _ = run(cached, prompt, max_tokens=20)
    assert len(completion) == 20  # the scaled tiny model never emits EOS this early
    flushed(cached)
    next_turn = prompt + tuple(completion) + tuple(random_tokens(40, seed=1))
    answer, cached_tokens, _ = run(cached, next_turn)
    assert cached_tokens == len(prompt) + len(completion)  # its last token fed once it was out
    assert answer == run(cold, next_turn)[0]


@pytest.mark.parametrize("shared", [1, 20, 57, 58])
def test_a_tail_serves_the_tokens_a_prompt_shares_with_it(engines, shared) -> None:
    """A stored tail of 60 tokens after one block: a prompt that shares only its first ``shared``
    tokens, then goes on otherwise (as a history renders an answer with other tokens than were
    sampled), reuses the block and exactly those tokens, with the cold prompt's logits and answer."""
    cached, cold = engines
    stored = tuple(random_tokens(BLOCK_SIZE + 60, seed=shared))
    run(cached, stored, max_tokens=1)
    flushed(cached)
    cached.cache.parts.ram.clear()  # NOTE: the tail read from its blob, as another process would
    cut = BLOCK_SIZE + shared
    prompt = stored[:cut] + tuple(10 + (t - 9) % 380 for t in stored[cut : cut + 3]) + stored[cut + 3 :]
    warm_logits, reused, fed = prefill_prompt(cached, prompt)
    cold_logits, _, _ = prefill_prompt(cold, prompt)
    assert (reused, fed) == (cut, len(prompt))
    assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
    assert run(cached, prompt)[0] == run(cold, prompt)[0]


@pytest.mark.parametrize("leaves", [124, 200, 265])
def test_a_history_that_renders_the_answer_otherwise_reuses_it_to_where_it_differs(engines, leaves) -> None:
    """A 120-token prompt and its 150-token answer (two blocks completed, a tail after them): the
    next turn holds the answer with other tokens from position ``leaves`` on (inside the first
    block it completed, inside the second, in its tail), and reuses everything before them, with
    the cold engine's logits and answer."""
    cached, cold = engines
    prompt = tuple(random_tokens(120, seed=leaves))
    answer, _, _ = run(cached, prompt, max_tokens=150)
    assert len(answer) == 150  # the scaled tiny model emits no EOS
    flushed(cached)
    cached.cache.parts.ram.clear()  # NOTE: read from the blobs, as another process would
    history = prompt + tuple(answer)
    other = tuple(10 + (t - 9) % 380 for t in history[leaves : leaves + 2])
    next_turn = history[:leaves] + other + history[leaves + 2 :] + tuple(random_tokens(30, seed=1))
    warm_logits, reused, fed = prefill_prompt(cached, next_turn)
    cold_logits, _, _ = prefill_prompt(cold, next_turn)
    assert (reused, fed) == (leaves, len(next_turn))
    assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
    assert run(cached, next_turn)[0] == run(cold, next_turn)[0]


def test_a_boundary_tail_serves_another_prompt_sharing_it(engines) -> None:
    """A tail stored at a boundary inside the prompt (where a system prompt ends) serves a prompt
    that shares the prompt up to there and goes on differently."""
    cached, _ = engines
    shared = tuple(random_tokens(170, seed=7))
    first = shared + tuple(random_tokens(30, seed=8))
    engine_events(cached, GenerationRequest(first, 1, GREEDY, boundaries=(len(shared),)))
    flushed(cached)
    other = shared + tuple(random_tokens(30, seed=9))
    _, reused, _ = prefill_prompt(cached, other)
    assert reused == len(shared)


def test_a_tail_never_crosses_a_namespace(tiny_model, make_cache) -> None:
    """Another tenant (another namespace) never sees a tail: the same prompt is a miss for it."""
    engine = Engine(tiny_model, make_cache(tiny_model))
    try:
        prompt = tuple(random_tokens(90, seed=3))
        run(engine, prompt)
        flushed(engine)
        events = engine_events(engine, GenerationRequest(prompt, 1, GREEDY, tenant="other"))
        done = next(e for e in events if isinstance(e, PrefillDone))
        assert done.cached_tokens == 0
        assert run(engine, prompt)[1] == len(prompt) - 1
    finally:
        engine.close()


def test_a_damaged_tail_is_a_miss_and_is_dropped(engines) -> None:
    """A tail's blob with a flipped byte fails its checksum: the prompt is computed without it,
    answers as the cold engine does, and the tail leaves the index. (The prompt left two tails,
    both able to serve it: its own, and its answer's, which holds its one token as well.)"""
    cached, cold = engines
    prompt = tuple(random_tokens(100, seed=5))
    run(cached, prompt, max_tokens=1)
    flushed(cached)
    cache = cached.cache
    cache.parts.ram.clear()
    blobs = list(cache.parts.blobs.scan(None))
    assert len(blobs) == 2
    for blob in blobs:
        path = cache.parts.blobs.root / blob.name
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    namespace = cached.loaded.namespace("default")
    longer = prompt + tuple(random_tokens(5, seed=6))
    for _ in blobs:  # NOTE: each lookup reads one of them (they serve it equally), drops it
        assert cache.lookup(namespace, longer).tail is None
    answer, reused, _ = run(cached, longer, max_tokens=1)
    assert reused == 0
    assert answer == run(cold, longer, max_tokens=1)[0]
    assert cache.admin.stats().verification_failures == 2
    assert cache.parts.index.missing(namespace, [b.block_hash for b in blobs]) == [True, True]
