"""Metrics, stats and explained misses (tiny model, real Redis, real HTTP)."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hashing import block_hashes
from tests.api import Api
from tests.helpers import random_tokens


def scrape(api: Api) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{api.server.base_url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def post(api: Api, prompt: list[int], **headers: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0}
    return httpx.post(f"{api.server.base_url}/v1/completions", json=body, headers=headers, timeout=60)


def test_metrics_move_by_exactly_the_tokens_in_usage(cached) -> None:
    """Token counters move by usage's prompt and cached tokens; TTFT lands under hit/partial/miss."""
    prompt = random_tokens(300, seed=301)
    for expected_kind in ("miss", "hit"):
        before = scrape(cached)
        usage = post(cached, prompt).json()["usage"]
        cached.flush()
        after = scrape(cached)

        def delta(name: str, before=before, after=after, **labels: str) -> float:
            key = (name, tuple(sorted(labels.items())))
            return after.get(key, 0.0) - before.get(key, 0.0)

        assert delta("kvproxy_prefix_cache_queries_total") == usage["prompt_tokens"]
        assert delta("kvproxy_prefix_cache_hits_total") == usage["prompt_tokens_details"]["cached_tokens"]
        assert delta("kvproxy_prompt_tokens_total") == usage["prompt_tokens"]
        assert delta("kvproxy_time_to_first_token_seconds_count", cache=expected_kind) == 1
        assert delta("kvproxy_requests_total", route="/v1/completions", status="200") == 1
    # NOTE: two blocks and two tails: after the prompt, and after the completion
    assert after[("kvproxy_cache_blocks", ())] == 4 and after[("kvproxy_redis_up", ())] == 1


def test_metric_labels_are_bounded(cached, settings, redis_client) -> None:
    """No prompt text, block hash or namespace ever appears in /metrics; evictions have reasons."""
    prompt = random_tokens(300, seed=302)
    post(cached, prompt)
    cached.flush()
    blob = next(settings.blob_root.rglob("*.safetensors"))
    blob.write_bytes(b"garbage")
    cached.cache.parts.ram.clear()  # the block must come from its (damaged) blob
    post(cached, prompt)
    text = httpx.get(f"{cached.server.base_url}/metrics").text
    namespace = cached.engine.loaded.namespace("default")
    assert namespace.hex() not in text
    assert not [h for h in block_hashes(prompt, namespace) if h.hex() in text]
    labels = set(re.findall(r'(\w+)="([^"]*)"', text))
    bounded = {
        "route",
        "status",
        "cache",
        "reason",
        "operation",
        "le",
        "model_name",
        "finished_reason",
        "outcome",
    }
    assert {name for name, _ in labels} <= bounded
    assert {value for name, value in labels if name == "model_name"} == {"tiny"}
    assert 'kvproxy_cache_blocks_evicted_total{reason="verification_failure"} 1.0' in text


def test_cache_headers_on_every_response(cached) -> None:
    """x-kvproxy-cache is miss, then partial, then hit; cached tokens agree with usage, and
    x-kvproxy-tail-tokens says how many of them a tail served."""
    prompt = random_tokens(300, seed=303)
    first = post(cached, prompt[:200])
    cached.flush()
    partial = post(cached, prompt)
    cached.flush()
    hit = post(cached, prompt)
    seen = [
        (
            r.headers["x-kvproxy-cache"],
            int(r.headers["x-kvproxy-cached-tokens"]),
            int(r.headers["x-kvproxy-tail-tokens"]),
        )
        for r in (first, partial, hit)
    ]
    # NOTE: the partial hit is block 0 and the tail the 200-token prompt stored after it
    assert seen == [("miss", 0, 0), ("partial", 200, 72), ("hit", 299, 43)]
    assert [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, partial, hit)] == [
        0,
        200,
        299,
    ]
    small = post(cached, prompt[:50])
    assert small.headers["x-kvproxy-cache"] == "miss" and "kvproxy_cache_explanation" not in small.json()


def test_explanation_names_the_diverging_position(cached) -> None:
    """Two prompts share 300 tokens then differ: the explanation names token 300 and shows both sides."""
    a = random_tokens(520, seed=304)
    b = a[:300] + random_tokens(220, seed=305)
    post(cached, a)
    cached.flush()
    r = post(cached, b, **{"x-kvproxy-explain": "1"})
    explanation = r.json()["kvproxy_cache_explanation"]
    assert explanation["cached_tokens"] == 256 and explanation["blocks_matched"] == 2
    assert explanation["first_unmatched_block"] == 2 and explanation["reason"] == "never seen"
    assert explanation["divergence"]["token_position"] == 300
    tokenizer = cached.engine.loaded.tokenizer
    assert explanation["divergence"]["prompt"] == tokenizer.decode(b[292:308])
    assert explanation["divergence"]["cached"] == tokenizer.decode(a[292:308])

    streamed = httpx.post(
        f"{cached.server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": b[:100], "max_tokens": 2, "stream": True},
        headers={"x-kvproxy-explain": "1"},
        timeout=120,
    )
    assert '"reason":"below one block"' in streamed.headers["x-kvproxy-explain"]


def test_explanations_reasons(cached, redis_client, key_prefix) -> None:
    """partial last block (no tail continues the blocks to the end: the stored one serves the 34
    tokens the two share); none for a repeat (blocks and tail); expired or evicted."""
    prompt = random_tokens(300, seed=306)
    post(cached, prompt)
    cached.flush()
    explain = {"x-kvproxy-explain": "1"}
    other_tail = prompt[:290] + random_tokens(10, seed=316)
    explanation = post(cached, other_tail, **explain).json()["kvproxy_cache_explanation"]
    assert (explanation["reason"], explanation["block_tokens"], explanation["tail_tokens"]) == (
        "partial last block",
        256,
        34,
    )
    explanation = post(cached, prompt, **explain).json()["kvproxy_cache_explanation"]
    assert (explanation["reason"], explanation["block_tokens"], explanation["tail_tokens"]) == (None, 256, 43)
    for key in redis_client.scan_iter(match=f"{key_prefix}*:b:*"):
        redis_client.delete(key)  # as if their TTL ran out
    assert (
        post(cached, prompt, **explain).json()["kvproxy_cache_explanation"]["reason"] == "expired or evicted"
    )


def test_stats_add_up_across_processes_and_windows(settings, tiny_model, serve) -> None:
    """Two servers on one Redis: /stats deployment totals are the sum; windows see the traffic."""
    with serve(settings, tiny_model) as one, serve(settings, tiny_model) as two:
        a, b = Api(one), Api(two)
        prompt = random_tokens(300, seed=307)
        a.complete(prompt)
        a.flush()
        b.complete(prompt)
        b.flush()
        stats = [httpx.get(f"{s.base_url}/stats").json() for s in (one, two)]
    deployment = stats[0]["deployment"]
    assert deployment["prompt_tokens"] == sum(s["process"]["prompt_tokens"] for s in stats) == 600
    assert deployment["cached_tokens"] == sum(s["process"]["cached_tokens"] for s in stats) == 299
    assert deployment["last_minute"] == {"queried_tokens": 600, "hit_tokens": 299, "hit_rate": 299 / 600}
    assert stats[1]["process"]["ttft_seconds"]["hit"]["count"] == 1


def test_a_tenant_sees_only_its_own_figures(settings, tiny_model, serve) -> None:
    """With API keys, /stats for key B shows none of A's traffic; the admin key sees both."""
    keyed = settings.model_copy(update={"api_keys": "ka,kb", "admin_key": "adm"})
    with serve(keyed, tiny_model) as server:
        url = server.base_url
        body = {"model": "tiny", "prompt": random_tokens(300, seed=308), "max_tokens": 2}
        httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer ka"}, timeout=120)
        Api(server).flush()

        def stats(key: str) -> dict:
            return httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {key}"}).json()

        a, b, admin = stats("ka"), stats("kb"), stats("adm")
        assert httpx.get(f"{url}/stats").status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer ka"}).status_code == 403
    assert a["scope"] == b["scope"] == "tenant" and admin["scope"] == "deployment"
    assert a["process"]["prompt_tokens"] == 300 and a["deployment"]["prompt_tokens"] == 300
    assert b["process"]["prompt_tokens"] == 0 and b["process"]["recent_misses"] == []
    assert b["deployment"].get("prompt_tokens", 0) == 0 and "blocks" not in b["deployment"]
    assert admin["deployment"]["prompt_tokens"] == 300
