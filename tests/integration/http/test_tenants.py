"""API keys and tenant isolation: the tenant comes from the key, never from the body."""

from __future__ import annotations

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from tests.api import Api
from tests.helpers import random_tokens

PROMPT = random_tokens(300, seed=201)


@pytest.fixture
def keyed(settings, tiny_model, serve, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# one per line\nkey-a\nkey-b\nkey-c1 = team\nkey-c2=team  # shares with c1\n")
    with serve(settings.model_copy(update={"api_keys": str(keys), "admin_key": "adm"}), tiny_model) as server:
        yield server


def complete(server, key: str, **extra) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0} | extra
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def cached(doc: dict) -> int:
    return doc["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_keys_never_share_but_chosen_keys_do(keyed) -> None:
    """A's repeat hits; B's identical prompt misses, computing every token like a fresh prompt,
    whatever body fields it sends; keys mapped to one tenant share."""
    engine = keyed.app.state.engine
    first = complete(keyed, "key-a")
    Api(keyed).flush()
    # A's repeat is a hit: its 2 blocks, then 43 tokens of its tail
    assert cached(complete(keyed, "key-a")) == len(PROMPT) - 1

    before = engine.stats().prefill_tokens
    b = complete(keyed, "key-b", user="key-a", prompt_cache_key="shared", cache_salt="")
    assert cached(b) == 0
    assert engine.stats().prefill_tokens - before == len(PROMPT)  # nothing reused: a fresh prompt's work
    assert b["choices"][0]["text"] == first["choices"][0]["text"]  # same model, same answer

    complete(keyed, "key-c1")
    Api(keyed).flush()
    # the operator chose to share "team": blocks and tail
    assert cached(complete(keyed, "key-c2")) == len(PROMPT) - 1


def test_authentication(keyed) -> None:
    """Every /v1 route needs a key; /health stays open; admin routes need the admin key (a valid
    API key gets 403: it is known, but not allowed)."""
    url = keyed.base_url
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
    ]:
        assert httpx.request(method, f"{url}{path}").status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{url}/v1", api_key="wrong").models.list()
    assert [m.id for m in OpenAI(base_url=f"{url}/v1", api_key="key-a").models.list().data] == ["tiny"]
    tenant_key = httpx.get(f"{url}/v1/cache/stats", headers={"Authorization": "Bearer key-a"})
    assert tenant_key.status_code == 403 and tenant_key.json()["error"]["code"] == "permission_denied"
    assert httpx.get(f"{url}/v1/cache/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(f"{url}/v1/cache/stats", headers={"Authorization": "Bearer adm"}).status_code == 200


def test_nothing_a_tenant_reads_reveals_another(keyed) -> None:
    """B's response (body and headers) is the same whether or not A cached the prompt."""

    def b_view() -> tuple:
        r = httpx.post(
            f"{keyed.base_url}/v1/completions",
            json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
            headers={"Authorization": "Bearer key-b"},
            timeout=120,
        )
        doc = r.json()
        headers = {k: v for k, v in r.headers.items() if k not in ("date", "content-length")}
        return doc["usage"], doc["choices"], headers

    before = b_view()
    Api(keyed).flush()  # NOTE: B's own blocks are stored before the clear, not after it
    Api(keyed).cache.admin.clear()
    complete(keyed, "key-a")
    Api(keyed).flush()
    after = b_view()
    assert before == after


def test_one_tenants_traffic_never_evicts_anothers_prefix(settings, tiny_model, serve, tmp_path) -> None:
    """The cache's byte budget (12 blocks) is full of tenant A's prompts; A past its share
    (``--tenant-share``: 3 blocks) gives up its own oldest blocks, so B's prefix, older than all
    of A's, is still a hit."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a\nkey-b\n")
    update = {
        "api_keys": str(keys),
        "admin_key": "adm",
        "max_cache_bytes": 12 * tiny_model.kv_spec.block_bytes,
    }
    with serve(settings.model_copy(update=update), tiny_model) as server:
        complete(server, "key-b")
        Api(server).flush()
        for seed in range(10):
            complete(server, "key-a", prompt=random_tokens(300, seed=300 + seed))
            Api(server).flush()
        assert cached(complete(server, "key-b")) >= 256
