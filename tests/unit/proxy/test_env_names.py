"""proxy/env_names.py: a ``KVPROXY_*`` variable that names no setting of the command started is
ignored, but with one warning naming it and the setting it probably meant."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from proxy import env_names
from proxy.config import Settings
from proxy.env_names import READ_ELSEWHERE
from proxy.flags import load_settings, parse_settings
from proxy.router.settings import RouteSettings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The warnings proxy.env_names logs during the test, in ``.messages`` (each message is logged
    once per process: forgotten before and after)."""
    env_names.warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="proxy.env_names"):
        yield caplog
    env_names.warn_once.cache_clear()


def test_a_misspelt_variable_gets_one_warning_naming_the_setting_meant(monkeypatch, logged) -> None:
    """KVPROXY_MAX_CACHE_BYTE: ignored, and said once however often the settings are read."""
    monkeypatch.setenv("KVPROXY_MAX_CACHE_BYTE", "10GB")
    monkeypatch.setenv("KVPROXY_TTL", "60")
    first, second = Settings(), Settings()
    assert first.max_cache_bytes is None and second.ttl == 60
    assert logged.messages == [
        "KVPROXY_MAX_CACHE_BYTE is not a setting of kvproxy serve: ignored "
        "(did you mean KVPROXY_MAX_CACHE_BYTES?)"
    ]


def test_each_command_is_checked_against_its_own_settings(monkeypatch, logged) -> None:
    """The router has no KVPROXY_MODEL (nothing close to suggest); a replica has no
    KVPROXY_UPSTREAM; names shared by both commands are never warned about."""
    for name, value in {
        "KVPROXY_MODEL": "smollm2-135m-instruct",
        "KVPROXY_UPSTREAM": "http://proxy:8000/v1",
        "KVPROXY_PORT": "8080",
        "KVPROXY_REDIS_URL": "redis://redis:6379/0",
    }.items():
        monkeypatch.setenv(name, value)
    RouteSettings()
    Settings()
    assert logged.messages == [
        "KVPROXY_MODEL is not a setting of kvproxy route: ignored",
        "KVPROXY_UPSTREAM is not a setting of kvproxy serve: ignored",
    ]


def test_a_required_setting_missing_for_a_typo_is_refused_with_the_hint(monkeypatch, logged) -> None:
    """`kvproxy route` with KVPROXY_UPSTREAMS: the start fails (no upstream), and the warning
    before it names the variable meant."""
    monkeypatch.delenv("KVPROXY_UPSTREAM", raising=False)
    monkeypatch.setenv("KVPROXY_UPSTREAMS", "http://proxy:8000/v1")
    with pytest.raises(click.UsageError, match="--upstream"):
        parse_settings(RouteSettings, {})
    assert logged.messages == [
        "KVPROXY_UPSTREAMS is not a setting of kvproxy route: ignored (did you mean KVPROXY_UPSTREAM?)"
    ]


def test_the_client_key_without_server_keys_is_a_server_left_open(monkeypatch, logged) -> None:
    """KVPROXY_API_KEY (the key `kvproxy cache` sends) set for a server that requires no key: one
    warning pointing at KVPROXY_API_KEYS, from both servers; none once keys are required, by
    variable or by flag."""
    monkeypatch.setenv("KVPROXY_API_KEY", "secret")
    assert Settings().api_keys is None
    RouteSettings(upstream="http://proxy:8000/v1")
    assert logged.messages == [
        f"KVPROXY_API_KEY is the key kvproxy cache sends, not a setting of kvproxy {command}: no key is "
        "required here; to require keys, set KVPROXY_API_KEYS (--api-keys)"
        for command in ("serve", "route")
    ]
    logged.clear()
    env_names.warn_once.cache_clear()
    monkeypatch.setenv("KVPROXY_API_KEYS", " ")  # NOTE: no key: the server stays open, and is said to
    parse_settings(Settings, {"api_keys": ""})
    assert len(logged.messages) == 1
    logged.clear()
    env_names.warn_once.cache_clear()
    parse_settings(Settings, {"api_keys": "secret=alice"})
    monkeypatch.setenv("KVPROXY_API_KEYS", "secret=alice")
    Settings()
    assert logged.messages == []


def test_the_commands_that_open_the_cache_directly_are_no_server(monkeypatch, logged) -> None:
    """`kvproxy cache` and `kvproxy models` read serve's settings as ``ToolSettings``: the key
    `kvproxy cache` sends is no mistake there, and a misspelt variable names those commands."""
    monkeypatch.setenv("KVPROXY_API_KEY", "secret")
    monkeypatch.setenv("KVPROXY_RDIS_URL", "redis://x")
    load_settings()
    assert logged.messages == [
        "KVPROXY_RDIS_URL is not a setting of kvproxy cache/models: ignored (did you mean KVPROXY_REDIS_URL?)"
    ]


def test_variables_read_on_purpose_elsewhere_are_not_warned_about(monkeypatch, logged) -> None:
    """`kvproxy cache`'s KVPROXY_API_KEY beside the keys a server requires, and the tests'
    KVPROXY_TEST_REDIS_URL, are no settings, but no mistake either; names are read
    case-insensitively, as pydantic-settings reads them."""
    monkeypatch.setenv("KVPROXY_API_KEY", "secret")
    monkeypatch.setenv("KVPROXY_API_KEYS", "secret=alice")
    monkeypatch.setenv("KVPROXY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("kvproxy_key_prefix", "kvp-test:")
    assert Settings().key_prefix == "kvp-test:"
    assert RouteSettings(upstream="http://proxy:8000/v1").key_prefix == "kvp-test:"
    assert logged.messages == []


def test_every_variable_the_code_reads_is_a_setting_or_listed_as_read_elsewhere() -> None:
    """Any KVPROXY_* name read outside the settings classes (a click envvar, os.environ) is in
    READ_ELSEWHERE, so that starting a server never warns about it."""
    fields = {f"KVPROXY_{name.upper()}" for kind in (Settings, RouteSettings) for name in kind.model_fields}
    read = re.compile(r"""(?:envvar=|environ\.get\(|getenv\()\s*["'](KVPROXY_\w+)["']""")
    folders = ("hashing", "store", "engine", "proxy", "bench", "tests")
    names = {
        name for f in folders for path in (ROOT / f).rglob("*.py") for name in read.findall(path.read_text())
    }
    assert {"KVPROXY_API_KEY", "KVPROXY_TEST_REDIS_URL"} <= names
    assert names - fields <= READ_ELSEWHERE, names - fields - READ_ELSEWHERE
