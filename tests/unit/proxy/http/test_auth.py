"""proxy/http/auth.py: API keys name tenants; keys naming one tenant share its cache."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from proxy.config import Settings
from proxy.http.auth import bearer, parse_api_keys
from proxy.http.errors import OpenAIError


def test_each_key_is_its_own_tenant_unless_named() -> None:
    table = parse_api_keys("k1=team, k2=team ,k3")
    assert table is not None and table["k1"] == table["k2"] == "team"
    assert table["k3"].startswith("key-") and table["k3"] != parse_api_keys("k4")["k4"]  # type: ignore[index]


def test_keys_from_a_file_with_comments(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text("# operators\nalpha=ops  # the on-call key\n\nbeta\n")
    table = parse_api_keys(str(path))
    assert table is not None and set(table) == {"alpha", "beta"} and table["alpha"] == "ops"


def test_no_keys_means_no_authentication_and_an_empty_list_is_an_error() -> None:
    assert parse_api_keys(None) is None and parse_api_keys("  ") is None
    with pytest.raises(ValueError):
        parse_api_keys(", ,")


def test_several_key_files_add_up_and_a_missing_one_is_an_error(tmp_path) -> None:
    """--api-keys given twice (joined by a comma) may name two files; a path to no file is an
    error, never a key; --admin-key reads its file the same way."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("alpha=ops\n")
    second.write_text("beta\n")
    table = parse_api_keys(f"{first},{second},gamma")
    assert table is not None and set(table) == {"alpha", "beta", "gamma"}
    with pytest.raises(ValueError, match="does not exist"):
        parse_api_keys(f"{tmp_path}/missing")
    (tmp_path / "admin").write_text("s3cret\n")
    assert Settings(admin_key=str(tmp_path / "admin")).admin_key == "s3cret"
    with pytest.raises(ValidationError, match="does not exist"):
        Settings(admin_key="/run/kvproxy/not-mounted")


def request(path: str, headers: dict[str, str], query: str = "") -> Request:
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "path": path, "query_string": query.encode(), "headers": pairs})


def test_one_key_in_several_places_is_one_key_and_two_different_ones_are_refused() -> None:
    """Each of ``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key`` alone is the key;
    ``?key=`` counts on the Gemini routes only; the same key in several places is that key, and
    two different ones are a 400 naming where the second came from (a server or router keyed on
    one while a replica read the other)."""
    same = {"authorization": "Bearer k", "x-api-key": "k", "x-goog-api-key": "k"}
    assert bearer(request("/v1/messages", same)) == "k"
    assert bearer(request("/v1/messages", {"x-api-key": "x"})) == "x"
    assert bearer(request("/v1beta/models", {"x-goog-api-key": "g"}, "key=g")) == "g"
    assert bearer(request("/v1beta/models", {}, "key=q")) == "q"
    assert bearer(request("/v1/models", {}, "key=q")) is None
    assert bearer(request("/v1/models", {"x-api-key": "x"}, "key=q")) == "x"
    for path, headers, query, where in [
        ("/v1/messages", {"authorization": "Bearer b", "x-api-key": "x"}, "", "x-api-key"),
        ("/v1beta/models", {"x-goog-api-key": "g"}, "key=q", "key"),
        ("/v1beta/models", {}, "key=q&key=r", "key"),
        ("/v1/chat/completions", {"authorization": "Basic dTpw", "x-api-key": "x"}, "", "x-api-key"),
    ]:
        with pytest.raises(OpenAIError) as refused:
            bearer(request(path, headers, query))
        assert refused.value.status == 400 and refused.value.param == where
