"""Kind 3, suffix lengths: any suffix on a cached 256-token prefix answers like cold."""

from __future__ import annotations

import math

import pytest

from tests.integration.conftest import random_tokens

PREFIX = random_tokens(256, seed=7)


@pytest.mark.parametrize("suffix_len", [1, 2, 127, 128, 129, 300])
def test_suffix_on_cached_prefix(cached, cold, suffix_len) -> None:
    """Identical completion, first-token log-probabilities within 1e-4 of cold."""
    cached.complete(PREFIX)
    cached.flush()
    prompt = PREFIX + random_tokens(suffix_len, seed=1000 + suffix_len)
    warm, reference = cached.complete(prompt), cold.complete(prompt)
    assert warm.cached_tokens == 256
    assert warm.key == reference.key
    assert warm.first_logprobs.keys() == reference.first_logprobs.keys()
    for token, logprob in reference.first_logprobs.items():
        assert math.isclose(warm.first_logprobs[token], logprob, abs_tol=1e-4)
