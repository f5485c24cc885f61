"""Kind 2, full hits: an exact repeat of a prompt of whole blocks prefills exactly one token."""

from __future__ import annotations

import pytest

from tests.integration.conftest import random_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("n", [128, 256, 384])
def test_exact_repeat_prefills_one_token(cached, cold, n, stream) -> None:
    """Repeat of an n-token prompt (n = 128k): n - 1 cached, one token prefilled, each token fed once,
    a non-empty completion identical to cold, and the worker keeps serving."""
    prompt = random_tokens(n, seed=n)
    cached.complete(prompt, stream=stream)
    cached.flush()
    before = dict(vars(cached.engine.stats))
    repeat = cached.complete(prompt, stream=stream)
    after = vars(cached.engine.stats)
    reference = cold.complete(prompt, stream=stream)

    assert repeat.cached_tokens == n - 1
    assert after["prefill_tokens"] - before["prefill_tokens"] == 1
    # every generated token but the last is fed exactly once (the last is never fed)
    assert after["decode_tokens"] - before["decode_tokens"] == len(repeat.token_ids) - 1
    assert repeat.token_ids and repeat.key == reference.key
    assert cached.complete(random_tokens(40, seed=1)).status == 200  # still serving
