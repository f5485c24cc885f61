"""Numbers read from request text, over real HTTP: a page token, a page size, a duration, an int
sent as a string, a ``logit_bias`` key, a Content-Length. ``str.isdigit`` accepts ``"²"`` (which
``int`` refuses) and ``"١٢"`` (which ``int`` reads as 12), and ``int`` refuses thousands of
digits: each is a 400 naming the field in the route's dialect (Google's shape on ``/v1beta``),
never a 500 and never a number the client did not write (``proxy.http.numbers``)."""

from __future__ import annotations

import socket

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.replicas import cluster, text

NOT_NUMBERS = ["²", "١٢", "1" * 5000, "-1", " 1", "1_0", "+1", "1.0"]
"""Superscript, Arabic-Indic digits, past int's digit limit, then a sign, a space, a separator."""
IDS = ["superscript", "arabic-indic", "5000-digits", "minus", "space", "underscore", "plus", "point"]


def gemini(server) -> genai.Client:
    options = types.HttpOptions(base_url=server.base_url, api_version="v1beta", timeout=120_000)
    return genai.Client(api_key="none", http_options=options)


def assert_google_400(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400 and field in error["message"]


@pytest.fixture
def server(settings, tiny_model, serve):
    with serve(settings, tiny_model) as running:
        yield running


@pytest.mark.parametrize("token", NOT_NUMBERS, ids=IDS)
def test_a_page_token_not_in_ascii_digits_is_a_400_on_gemini_listings(server, token) -> None:
    """``cachedContents`` and ``models`` listings (google-genai sends the token as given): 400
    INVALID_ARGUMENT naming pageToken, never a 500."""
    client = gemini(server)
    for listing in (client.caches.list, client.models.list):
        with pytest.raises(genai_errors.ClientError) as refused:
            list(listing(config={"page_token": token, "page_size": 1}))
        assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
        assert "pageToken" in refused.value.message


@pytest.mark.parametrize("size", ["²", "\u0661", "1" * 5000, "0", "1001", " 5"], ids=lambda s: s[:8])
def test_a_page_size_not_in_range_is_a_400_on_gemini_listings(server, size) -> None:
    """``pageSize`` (google-genai sends ints; httpx sends these strings): 1 to 1000 in ASCII digits."""
    for path in ("cachedContents", "models"):
        r = httpx.get(f"{server.base_url}/v1beta/{path}", params={"pageSize": size}, timeout=30)
        assert_google_400(r, "pageSize")


def test_the_models_listing_pages_as_gemini_does(server) -> None:
    """A token this server gave reads the next page; past the end, an empty page."""
    first = httpx.get(f"{server.base_url}/v1beta/models", params={"pageSize": "1"}, timeout=30).json()
    assert [m["name"] for m in first["models"]] == ["models/tiny"]
    beyond = httpx.get(f"{server.base_url}/v1beta/models", params={"pageToken": "7"}, timeout=30).json()
    assert beyond == {"models": []}
    client = gemini(server)  # NOTE: kept: the pager reads through it
    assert [m.name for m in client.models.list()] == ["models/tiny"]


@pytest.mark.parametrize("ttl", ["٣s", "²s", "1" * 5000 + "s", "1" * 13 + "s", "1.0000000001s"], ids=str)
def test_a_ttl_is_protobufs_duration_in_ascii_digits(server, ttl) -> None:
    """A named cache's ``ttl``: at most 12 ASCII digits of seconds and 9 of fractions, else 400
    naming ttl (Arabic-Indic digits were read as 3 seconds)."""
    document = text(1, 200)  # over a block: a cache that would be made
    body = {"model": "models/tiny", "contents": [{"parts": [{"text": document}]}], "ttl": ttl}
    r = httpx.post(f"{server.base_url}/v1beta/cachedContents", json=body, timeout=60)
    assert_google_400(r, "ttl")


@pytest.mark.parametrize("value", ["١٢", "1" * 30, "1_0", " 4", "4.0"], ids=str)
def test_an_int32_sent_as_a_string_is_ascii_digits(server, value) -> None:
    """``seed`` and ``maxOutputTokens`` as protobuf JSON strings: ``"4"`` works, other text is a
    400 naming the field; a seed past int32 too."""
    url = f"{server.base_url}/v1beta/models/tiny:generateContent"
    base = {"contents": [{"parts": [{"text": "hi"}]}]}
    ok = httpx.post(url, json=base | {"generationConfig": {"maxOutputTokens": "4", "seed": "-7"}}, timeout=60)
    assert ok.status_code == 200, ok.text
    for field in ("seed", "maxOutputTokens"):
        config = {"maxOutputTokens": 4, field: value}
        assert_google_400(httpx.post(url, json=base | {"generationConfig": config}, timeout=60), field)
    big = httpx.post(url, json=base | {"generationConfig": {"seed": 2**40}}, timeout=60)
    assert_google_400(big, "seed")


@pytest.mark.parametrize(
    "field", ["seed", "maxOutputTokens", "candidateCount", "temperature", "topP", "presencePenalty"]
)
@pytest.mark.parametrize("value", [True, False, " 1", "+1", "1_0", "0.5\n", "\u0661"])
def test_a_boolean_or_loose_text_is_no_number(server, field, value) -> None:
    """``true`` and ``false`` in a number field, and text pydantic would read loosely (a space, a
    plus, an underscore, another script's digits), are a 400 naming it; Gemini refuses them."""
    url = f"{server.base_url}/v1beta/models/tiny:generateContent"
    config = {"maxOutputTokens": 4, field: value}
    body = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": config}
    assert_google_400(httpx.post(url, json=body, timeout=60), field)


@pytest.mark.parametrize("key", ["١٢", "²", "1" * 5000, "+12", " 12"], ids=lambda k: k[:8])
def test_a_logit_bias_key_is_a_token_id_in_ascii_digits(server, key) -> None:
    """OpenAI's ``logit_bias`` keys: ``"١٢"`` is not token 12; each is a 400 naming logit_bias."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, logit_bias={"12": 1})
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, logit_bias={key: 1})
    assert refused.value.body["param"] == "logit_bias"


def test_a_content_length_of_thousands_of_digits_is_refused_not_a_500(server) -> None:
    """A declared length past int's digit limit: refused (413 or the HTTP parser's 400)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}"
        )
        status = s.recv(100).split(b" ")[1]
    assert status in (b"400", b"413")


def test_the_router_pages_gemini_listings_with_ascii_tokens_only(settings, tiny_model, tmp_path) -> None:
    """Through ``kvproxy route``: a page token or size that is not one is a 400 in Google's shape
    on both listings, and the models listing pages."""
    with cluster(settings, tiny_model, tmp_path) as (fronts, _):
        front = fronts[0]
        for path in ("cachedContents", "models"):
            for token in ("²", "١٢", "1" * 5000):
                r = httpx.get(f"{front.base_url}/v1beta/{path}", params={"pageToken": token}, timeout=60)
                assert_google_400(r, "pageToken")
            assert_google_400(httpx.get(f"{front.base_url}/v1beta/{path}?pageSize=²", timeout=60), "pageSize")
        models = httpx.get(f"{front.base_url}/v1beta/models", params={"pageSize": "1"}, timeout=60).json()
        assert [m["name"] for m in models["models"]] == ["models/tiny"] and "nextPageToken" not in models
