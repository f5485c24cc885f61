"""proxy/http/auth.py: API keys name tenants; keys naming one tenant share its cache."""

from __future__ import annotations

import pytest

from proxy.http.auth import parse_api_keys


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
