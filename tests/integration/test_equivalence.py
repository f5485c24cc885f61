"""A cached answer equals the uncached answer: greedy tokens identical, logits within 1e-4.

Tiny random Llama, float32, real Redis and blob store. Each case warms the cache with one
prompt, then compares a second prompt computed through the cache with the same prompt cold.
"""

from __future__ import annotations

import pytest
import torch

from engine.generate import SamplingParams
from engine.worker import Engine, Event, Finished, GenerationRequest, PrefillDone, TokenDelta
from hashing import BLOCK_SIZE

GREEDY = SamplingParams(temperature=0.0)


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(10, 390, (n,), generator=g).tolist())


def run(engine: Engine, prompt: tuple[int, ...], max_tokens: int = 12) -> tuple[list[int], int, str]:
    """Generate on the calling thread: (token ids, cached tokens, finish reason)."""
    events: list[Event] = []
    engine.generate(GenerationRequest(prompt, max_tokens, GREEDY), events.append)
    done = next(e for e in events if isinstance(e, PrefillDone))
    finished = next(e for e in events if isinstance(e, Finished))
    return (
        [e.token_id for e in events if isinstance(e, TokenDelta)],
        done.cached_tokens,
        finished.finish_reason,
    )


@pytest.fixture
def engines(tiny_model, make_cache):
    cached, cold = Engine(tiny_model, make_cache(tiny_model)), Engine(tiny_model, None)
    yield cached, cold
    cached.close()
    cold.close()


@pytest.mark.parametrize(
    ("warm_len", "prompt_len", "expected_cached"),
    [
        (300, 350, 256),  # partial hit: two of two cached blocks, a 94-token suffix
        (256, 257, 256),  # a hit whose suffix is one token
        (384, 384, 383),  # fully cached, length a multiple of 128: reuse 127 of block 3
        (128, 128, 127),
        (127, 300, 0),  # warm prompt had no full block
    ],
)
def test_cached_equals_cold(engines, warm_len, prompt_len, expected_cached) -> None:
    """Same greedy tokens and last-position logits within 1e-4, and exact cached_tokens."""
    cached, cold = engines
    prompt = tokens(max(warm_len, prompt_len))
    run(cached, prompt[:warm_len], max_tokens=1)
    assert cached.cache is not None and cached.cache.flush(30)

    ns = cached.namespace("default")
    warm_result = cached.prefill_prompt(ns, prompt[:prompt_len], lambda: False)
    cold_result = cold.prefill_prompt(ns, prompt[:prompt_len], lambda: False)
    assert warm_result.cached_tokens == expected_cached and cold_result.cached_tokens == 0
    assert torch.allclose(warm_result.logits, cold_result.logits, atol=1e-4, rtol=0)
    assert warm_result.past.get_seq_length() == prompt_len  # no token fed twice

    warm_tokens, warm_cached, warm_reason = run(cached, prompt[:prompt_len])
    cold_tokens, _, cold_reason = run(cold, prompt[:prompt_len])
    assert warm_cached == expected_cached
    assert (warm_tokens, warm_reason) == (cold_tokens, cold_reason)


def test_generated_blocks_are_cached_for_the_next_turn(engines) -> None:
    """Prompt + completion crossing a block boundary is stored; a prompt extending it hits."""
    cached, cold = engines
    prompt = tokens(250)
    completion, _, _ = run(cached, prompt, max_tokens=20)
    assert len(completion) == 20  # the scaled tiny model never emits EOS this early
    assert cached.cache is not None and cached.cache.flush(30)
    next_turn = prompt + tuple(completion) + tokens(40, seed=1)
    tokens_warm, cached_tokens, _ = run(cached, next_turn)
    assert cached_tokens == 2 * BLOCK_SIZE
    assert tokens_warm == run(cold, next_turn)[0]


def test_full_hit_prefills_exactly_one_token(engines) -> None:
    """A fully cached 256-token prompt: 255 tokens reused, the last one computed once."""
    cached, _ = engines
    prompt = tokens(256)
    run(cached, prompt, max_tokens=1)
    assert cached.cache is not None and cached.cache.flush(30)
    result = cached.prefill_prompt(cached.namespace("default"), prompt, lambda: False)
    assert (result.cached_tokens, result.past.get_seq_length()) == (255, 256)
