"""Exact speculative decoding (``engine.drafting``, ``Runner._accept``): a server drafting from
each sequence's own tokens answers exactly as one decoding a token a step (``--no-speculation``):
greedy and seeded, alone and batched, to a stop string or the token limit, and what it stores
serves the next turn as a cold server computes it. Drafts are accepted and rejected along the way
(the counters say so), so both of ``_accept``'s outcomes are exercised."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.kernels.build import compiler
from hashing import BLOCK_SIZE
from tests.api import Api
from tests.helpers import random_tokens, wait_for

pytestmark = pytest.mark.skipif(compiler() is None, reason="speculation needs the native step")


@pytest.fixture
def plain(settings, tiny_model, serve) -> Iterator[Api]:
    """A cold server decoding one token a step."""
    off = settings.model_copy(update={"no_cache": True, "no_speculation": True})
    with serve(off, tiny_model) as server:
        yield Api(server)


def _prompts() -> list[list[int]]:
    """Prompts whose answers copy spans of them (a span repeated, so the random model's own loops
    and the prompt's repeats give drafts to check), and plain random ones."""
    out = []
    for seed in range(6):
        span = random_tokens(40, seed=100 + seed)
        out.append(random_tokens(30, seed=seed) + span + random_tokens(7, seed=50 + seed) + span[:12])
    out += [random_tokens(n, seed=200 + n) for n in (9, 140, 260)]
    return out


def _no_eos(api: Api) -> dict:
    return {"logit_bias": {str(api.engine.loaded.tokenizer.eos_token_id): -100}}


def test_greedy_answers_and_logprobs_are_those_without_speculation(cached, plain) -> None:
    """Nine prompts, 96 tokens each: the same token ids, text and log-probabilities; drafts were
    both accepted and rejected."""
    assert cached.engine.runner.speculate and not plain.engine.runner.speculate
    for prompt in _prompts():
        ours, theirs = (
            api.complete(prompt, max_tokens=96, logprobs=3, **_no_eos(cached)) for api in (cached, plain)
        )
        assert ours.key == theirs.key
        assert ours.first_logprobs == theirs.first_logprobs
    stats = cached.engine.stats()
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert stats.decode_steps < stats.decode_tokens  # several tokens a step, one sequence at a time
    assert plain.engine.stats().draft_tokens == 0


def test_seeded_sampling_draws_the_same_answer(cached, plain) -> None:
    """temperature 0.8 with a seed: the sampler draws once per token in the same order from the
    same logits, drafts or not."""
    for seed, prompt in enumerate(_prompts()[:4]):
        body = {"temperature": 0.8, "seed": seed, **_no_eos(cached)}
        assert (
            cached.complete(prompt, max_tokens=80, **body).key
            == plain.complete(prompt, max_tokens=80, **body).key
        )
    assert cached.engine.stats().draft_tokens > 0


def test_concurrent_drafting_sequences_answer_as_alone(cached, plain) -> None:
    """Four requests at once, each with its own drafts in the shared step (a past several times
    in one call): each answer is the plain server's alone."""
    prompts = _prompts()[:4]
    expected = [plain.complete(p, max_tokens=64, **_no_eos(plain)).key for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: cached.complete(p, max_tokens=64, **_no_eos(cached)), prompts))
    assert [r.key for r in results] == expected
    assert cached.engine.stats().accepted_tokens > 0


def test_a_stop_string_or_the_token_limit_inside_a_draft_ends_the_answer_there(cached, plain) -> None:
    """Every token limit from 1 to 20 (drafts run past them) and a stop string taken from the
    answer's middle: the same answers, finish reasons and lengths."""
    prompt = _prompts()[0]
    for limit in range(1, 21):
        ours, theirs = (api.complete(prompt, max_tokens=limit, **_no_eos(api)) for api in (cached, plain))
        assert ours.key == theirs.key and len(ours.token_ids) == limit
    whole = plain.complete(prompt, max_tokens=60, **_no_eos(plain))
    stop = whole.text[len(whole.text) // 2 :][:3]
    ours, theirs = (
        api.complete(prompt, max_tokens=60, stop=[stop], **_no_eos(api)) for api in (cached, plain)
    )
    assert ours.key == theirs.key and ours.finish_reason == "stop"


def test_what_a_drafted_answer_stores_serves_the_next_turn_as_cold(cached, plain) -> None:
    """The answer's K/V (rejected drafts' rows dropped) is stored; the next turn (prompt, answer
    and more) reuses it, and answers as the plain cold server does."""
    prompt = _prompts()[1]
    first = cached.complete(prompt, max_tokens=300, **_no_eos(cached))
    assert cached.engine.stats().accepted_tokens > 0
    cached.flush()
    turn = prompt + first.token_ids + random_tokens(5, seed=9)
    ours, theirs = (api.complete(turn, max_tokens=40, **_no_eos(api)) for api in (cached, plain))
    assert ours.cached_tokens >= 256 and ours.key == theirs.key


def test_a_repeated_prompt_drafts_the_answer_the_cache_holds_after_it(cached, plain) -> None:
    """A prompt asked again (a regenerate, a retry, a fork) drafts from the tail its first answer
    stored after it (``PrefixMatch.continuation``): more of the answer is accepted than prompt
    lookup alone finds (the cold server's), and the answer is the same."""
    for n in (5, 140, 300):
        prompt = random_tokens(n, seed=700 + n)
        body = {"max_tokens": 48, **_no_eos(cached)}
        first = cached.complete(prompt, **body)
        cached.flush()
        before = cached.engine.stats().accepted_tokens
        again = cached.complete(prompt, **body)
        reused = cached.engine.stats().accepted_tokens - before
        before = plain.engine.stats().accepted_tokens
        assert plain.complete(prompt, **body).key == again.key == first.key
        alone = plain.engine.stats().accepted_tokens - before
        # NOTE: of the answer's tokens in the tail of its first block (after the first, sampled at
        # prefill), all are drafted but one a step (sampled from the last row), at most 4 steps
        held = min(BLOCK_SIZE - 1 - n % BLOCK_SIZE, 47)
        assert reused >= held - 4 and reused > alone, n


def test_a_cancelled_answer_s_drafts_are_counted_on_stats_as_on_metrics(cached) -> None:
    """A stream closed once a draft of it was accepted: its drafts count in ``/stats`` as in the
    engine's own counters (``/metrics``)."""
    body = {"model": "tiny", "prompt": _prompts()[3], "max_tokens": 400, "stream": True, **_no_eos(cached)}
    with httpx.stream("POST", f"{cached.server.base_url}/v1/completions", json=body, timeout=60) as r:
        for _ in r.iter_lines():
            if cached.engine.stats().accepted_tokens > 0:  # closed once a draft was accepted
                break
    wait_for(lambda: cached.engine.idle, what="the cancelled answer to end")
    stats = cached.engine.stats()
    assert stats.draft_tokens > 0

    def counted() -> bool:  # NOTE: the server records the end on its event loop, a moment later
        process = httpx.get(f"{cached.server.base_url}/stats", timeout=30).json()["process"]
        counts = stats.draft_tokens, stats.accepted_tokens
        return (process["draft_tokens"], process["accepted_tokens"]) == counts

    wait_for(counted, timeout_s=30, what="/stats to count the cancelled answer's drafts")


def test_the_explanation_metrics_and_stats_count_drafts(cached) -> None:
    prompt = _prompts()[2]
    r = httpx.post(
        f"{cached.server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 64, "temperature": 0, **_no_eos(cached)},
        headers={"x-kvproxy-explain": "1"},
        timeout=120,
    )
    speculation = r.json()["kvproxy_cache_explanation"]["speculation"]
    assert 0 <= speculation["accepted_tokens"] <= speculation["draft_tokens"]
    stats = cached.engine.stats()
    assert speculation["draft_tokens"] == stats.draft_tokens > 0
    metrics = httpx.get(f"{cached.server.base_url}/metrics", timeout=30).text
    assert f"kvproxy_draft_tokens_total {float(stats.draft_tokens)}" in metrics
    assert f"kvproxy_draft_accepted_tokens_total {float(stats.accepted_tokens)}" in metrics
    process = httpx.get(f"{cached.server.base_url}/stats", timeout=30).json()["process"]
    assert process["draft_tokens"] == stats.draft_tokens
    assert process["accepted_tokens"] == stats.accepted_tokens
