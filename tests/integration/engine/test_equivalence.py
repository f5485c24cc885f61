"""A cached answer equals the uncached answer: greedy tokens identical, logits within 1e-4.

Tiny random Llama, float32, real Redis and blob store. Each case warms the cache with one
prompt, then compares a second prompt computed through the cache with the same prompt cold.
"""

from __future__ import annotations

import pytest
import torch

from engine.worker import Engine
from tests.helpers import HANG_S, prefill_prompt, random_tokens
from tests.helpers import run_engine as run


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    return tuple(random_tokens(n, seed))


@pytest.fixture
def engines(tiny_model, make_cache):
    cached, cold = Engine(tiny_model, make_cache(tiny_model)), Engine(tiny_model, None)
    yield cached, cold
    cached.close()
    cold.close()


@pytest.mark.parametrize(
    ("warm_len", "prompt_len", "expected_cached"),
    [
        (300, 350, 300),  # two blocks and the 44-token tail the warm prompt stored, a 50-token suffix
        (256, 257, 256),  # a hit whose suffix is one token
        (300, 310, 300),  # a 10-token suffix after the tail: one multi-token step (native)
        (250, 266, 250),  # a 16-token suffix across block 2's start, the same way
        (384, 384, 383),  # fully cached, length a multiple of 128: reuse 127 of block 3
        (128, 128, 127),
        (127, 300, 127),  # the warm prompt had no full block: its tail, at the root
    ],
)
def test_cached_equals_cold(engines, warm_len, prompt_len, expected_cached) -> None:
    """Same greedy tokens and last-position logits within 1e-4, and exact cached_tokens."""
    cached, cold = engines
    prompt = tokens(max(warm_len, prompt_len))
    run(cached, prompt[:warm_len], max_tokens=1)
    assert cached.cache is not None and cached.cache.flush(HANG_S)

    warm_logits, warm_reused, warm_fed = prefill_prompt(cached, prompt[:prompt_len])
    cold_logits, cold_reused, _ = prefill_prompt(cold, prompt[:prompt_len])
    assert warm_reused == expected_cached and cold_reused == 0
    assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
    assert warm_fed == prompt_len  # no token fed twice

    warm_tokens, warm_cached, warm_reason = run(cached, prompt[:prompt_len])
    cold_tokens, _, cold_reason = run(cold, prompt[:prompt_len])
    assert warm_cached == expected_cached
    assert (warm_tokens, warm_reason) == (cold_tokens, cold_reason)


def test_generated_blocks_are_cached_for_the_next_turn(engines) -> None:
    """Prompt + completion crossing a block boundary is stored (blocks, then the tail up to its
    last token); a prompt extending it hits all of it."""
    cached, cold = engines
    prompt = tokens(250)
    completion, _, _ = run(cached, prompt, max_tokens=20)
    assert len(completion) == 20  # the scaled tiny model never emits EOS this early
    assert cached.cache is not None and cached.cache.flush(HANG_S)
    next_turn = prompt + tuple(completion) + tokens(40, seed=1)
    tokens_warm, cached_tokens, _ = run(cached, next_turn)
    assert cached_tokens == len(prompt) + len(completion)
    assert tokens_warm == run(cold, next_turn)[0]


def test_full_hit_prefills_exactly_one_token(engines) -> None:
    """A fully cached 256-token prompt: 255 tokens reused, the last one computed once."""
    cached, _ = engines
    prompt = tokens(256)
    run(cached, prompt, max_tokens=1)
    assert cached.cache is not None and cached.cache.flush(HANG_S)
    _, reused, fed = prefill_prompt(cached, prompt)
    assert (reused, fed) == (255, 256)
