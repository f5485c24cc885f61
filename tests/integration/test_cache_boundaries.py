"""Kind 1, block boundaries: lengths around multiples of 128 report exact cached_tokens."""

from __future__ import annotations

import pytest

from tests.integration.conftest import random_tokens

LENGTHS = [127, 128, 129, 255, 256, 257, 383, 384, 385, 1024, 1025]


@pytest.mark.parametrize("n", LENGTHS)
def test_second_send_reports_exact_cached_tokens(cached, cold, n) -> None:
    """Second send: cached_tokens = min(128 * (n // 128), n - 1); completion identical to cold."""
    prompt = random_tokens(n, seed=n)
    first = cached.complete(prompt)
    cached.flush()
    second = cached.complete(prompt)
    reference = cold.complete(prompt)
    assert first.cached_tokens == 0
    assert second.cached_tokens == min(128 * (n // 128), n - 1)
    assert second.prompt_tokens == n
    assert first.key == second.key == reference.key
    assert len(second.token_ids) > 0
