"""The dashboard in headless Chromium: it renders, the figures it shows are /stats', its charts
have labelled axes and times, and a tenant's prompt text is shown to that tenant only."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import httpx

from proxy.observe.panels import prefix_text
from tests.api import Api
from tests.chromium import chromium
from tests.helpers import random_tokens

CHARTS = ("chart-hit-rate", "chart-ttft", "chart-ttft-prefix", "chart-ttft-length", "chart-usage")
TIME_CHARTS = ("chart-hit-rate", "chart-ttft", "chart-usage")


def shown(dom: str) -> dict[str, Any]:
    """Every figure on the page: ``{data-field: the value it shows, as JSON}``."""
    pairs = re.findall(r'data-field="([\w.]+)"[^>]*data-value="([^"]*)"', dom)
    return {field: json.loads(html.unescape(raw)) for field, raw in pairs}


def at(stats: dict[str, Any], field: str, strict: bool) -> Any:
    """The value of a dotted path (list items by index) in /stats; a key it lacks (a figure out
    of the caller's scope or Redis', or no audit on this server) is None unless ``strict``."""
    value: Any = stats
    for part in field.split("."):
        if isinstance(value, list):
            value = value[int(part)]
        elif strict or (value is not None and part in value):
            value = value[part]
        else:
            return None
    return value


def rows(figures: dict[str, Any], table: str, *columns: str) -> list[tuple[Any, ...]]:
    """The rows a table shows: ``columns`` of ``{table}.0``, ``{table}.1``, ..."""
    count = len({f.split(".")[1] for f in figures if f.startswith(f"{table}.")})
    return [tuple(figures[f"{table}.{i}.{c}"] for c in columns) for i in range(count)]


def assert_page_equals_stats(dom: str, stats: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """The page loaded, and each figure equals /stats' (TTLs, counting down, to a few seconds)."""
    assert 'data-loaded="1"' in dom
    figures = shown(dom)
    for field, value in figures.items():
        if field.endswith(".ttl_seconds"):
            assert value - 5 <= at(stats, field, strict) <= value, field
        else:
            assert value == at(stats, field, strict), field
    return figures


def assert_charts_are_labelled(dom: str) -> None:
    """Each chart has x and y axis titles and tick labels; time axes are labelled HH:MM."""
    for chart in CHARTS:
        svg = re.search(rf'<svg id="{chart}"[^>]*>(.*?)</svg>', dom, re.S)
        assert svg is not None, chart
        for axis in ("x", "y"):
            assert re.search(rf'class="axis-title" data-axis="{axis}"[^>]*>[^<]+<', svg[1]), (chart, axis)
        assert len(re.findall(r'class="tick[^"]*"[^>]*>[^<]+<', svg[1])) >= 4, chart
        if chart in TIME_CHARTS:
            assert len(re.findall(r'class="tick time"[^>]*>\d\d:\d\d<', svg[1])) >= 5, chart


def test_dashboard_shows_the_stats(settings, tiny_model, serve, tmp_path) -> None:
    """Misses, hits and a partial hit: the page's figures (hot prefixes, tenants, audit too) equal
    /stats, the hot prefix hit twice leads with its text, the charts are labelled; a screenshot."""
    with serve(settings, tiny_model) as server:
        api = Api(server)
        prompt = random_tokens(300, seed=401)
        api.complete(prompt)
        api.flush()
        api.complete(prompt)
        api.complete(prompt)
        api.complete(prompt[:200] + random_tokens(150, seed=402))
        api.flush()
        dom = chromium("--dump-dom", f"{server.base_url}/dashboard")
        stats = httpx.get(f"{server.base_url}/stats").json()
        shot = tmp_path / "dashboard.png"
        chromium("--window-size=1300,2400", f"--screenshot={shot}", f"{server.base_url}/dashboard")
    figures = assert_page_equals_stats(dom, stats, strict=True)
    assert len(figures) >= 40
    assert figures["deployment.cached_tokens"] == 2 * 299 + 128  # two blocks and the tail, twice
    text = prefix_text(tiny_model.tokenizer, prompt[:128])
    assert rows(figures, "hot_prefixes", "hits", "tokens_saved", "cached_tokens", "text") == [
        (2, 598, 256, text),
        (1, 128, 128, text),
    ]
    assert len(text) == 60 and text in html.unescape(dom)
    assert rows(figures, "tenants", "tenant", "hit_rate") == [("default", 726 / 1250)]
    minutes = stats["process"]["ttft_per_minute"]
    assert sum(m[kind]["count"] for m in minutes for kind in ("hit", "partial", "miss")) == 4
    bins = [(b["min_tokens"], b["count"]) for b in stats["process"]["ttft_by_cached_tokens"] if b["count"]]
    assert bins == [(0, 1), (1, 1), (256, 2)]
    lengths = {
        (b["min_tokens"], kind): b[kind]["count"]
        for b in stats["process"]["ttft_by_prompt_tokens"]
        for kind in ("hit", "partial", "miss")
        if b[kind]["count"]
    }
    assert lengths == {
        (256, "hit"): 2,
        (256, "partial"): 1,
        (256, "miss"): 1,
    }  # hits beside misses of their length
    hits = stats["process"]["ttft_seconds"]["hit"]
    assert hits["prompt_tokens_p50"] == 300 and hits["per_uncached_token_p50"] == hits["p50"] / 1
    assert_charts_are_labelled(dom)
    assert "n=2" in dom and ">miss<" in dom  # a bin's count, the TTFT legend
    assert stats["usage"] and stats["usage"][0]["blocks"] == 0  # sampled at start
    assert "never seen" in dom  # the recent misses table
    assert shot.stat().st_size > 10_000


def test_a_tenant_sees_its_own_prompts_and_the_admin_none(settings, tiny_model, serve) -> None:
    """Two tenants and the admin key: each tenant's page lists its own hot prefix with its text
    and no tenant table; the admin's lists both tenants' prefixes, the text withheld, and the
    hit rate of each tenant."""
    keyed = settings.model_copy(update={"api_keys": "ka=alice,kb=bob", "admin_key": "adm"})
    mine, theirs = random_tokens(300, seed=411), random_tokens(300, seed=412)
    with serve(keyed, tiny_model) as server:
        url = server.base_url

        def complete(key: str, prompt: list[int]) -> None:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
            r = httpx.post(
                f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
            )
            assert r.status_code == 200, r.text
            Api(server).flush()

        for key, prompt, times in (("ka", mine, 2), ("kb", theirs, 3)):
            for _ in range(times):
                complete(key, prompt)

        def page(key: str) -> tuple[str, dict[str, Any]]:
            dom = chromium("--dump-dom", f"{url}/dashboard#key={key}")
            stats = httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {key}"}).json()
            return dom, stats

        (alice, alice_stats), (admin, admin_stats) = page("ka"), page("adm")
    texts = prefix_text(tiny_model.tokenizer, mine[:128]), prefix_text(tiny_model.tokenizer, theirs[:128])

    figures = assert_page_equals_stats(alice, alice_stats)
    assert (figures["hot_prefixes.0.tenant"], figures["hot_prefixes.0.hits"]) == ("alice", 1)
    assert rows(figures, "hot_prefixes", "text") == [(texts[0],)]
    assert texts[0] in html.unescape(alice) and texts[1] not in html.unescape(alice)
    assert re.search(r'id="tenants-card" style="display: none;"', alice)

    figures = assert_page_equals_stats(admin, admin_stats)
    hot = rows(figures, "hot_prefixes", "tenant", "hits", "tokens_saved", "text")
    assert hot == [("bob", 2, 598, None), ("alice", 1, 299, None)]  # blocks and tail each hit
    assert texts[0] not in html.unescape(admin) and texts[1] not in html.unescape(admin)
    assert html.unescape(admin).count(">hidden: another tenant's prompt</td>") == 2
    tenants = rows(figures, "tenants", "tenant", "prompt_tokens", "cached_tokens")
    assert tenants == [("bob", 900, 598), ("alice", 600, 299)]
    assert_charts_are_labelled(admin)


def test_redis_down_leaves_the_page_without_its_tables(settings, tiny_model, serve) -> None:
    """With Redis unreachable, /stats answers 200 with the Redis-backed panels None, and the page
    still loads and says so."""
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with serve(down, tiny_model) as server:
        Api(server).complete(random_tokens(300, seed=421))
        r = httpx.get(f"{server.base_url}/stats")
        dom = chromium("--dump-dom", f"{server.base_url}/dashboard")
    assert r.status_code == 200
    stats = r.json()
    assert (stats["cache"], stats["hot_prefixes"], stats["tenants"], stats["timeline"]) == (
        "degraded",
        None,
        None,
        None,
    )
    assert_page_equals_stats(dom, stats)
    assert "no data: cache off or Redis unreachable" in dom
