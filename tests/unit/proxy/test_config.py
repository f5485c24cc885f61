"""proxy/config.py: sizes with units, and settings from the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import Settings, parse_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("20MB", 20_000_000),
        ("20m", 20_000_000),
        ("1.5 GiB", 1_610_612_736),
        ("1g", 10**9),
        (7, 7),
    ],
)
def test_sizes_parse_with_decimal_and_binary_units(text, size) -> None:
    assert parse_bytes(text) == size


def test_a_bad_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes("lots")


def test_settings_come_from_the_environment_and_fail_at_start_up(monkeypatch) -> None:
    monkeypatch.setenv("KVPROXY_RAM_CACHE_BYTES", "64MiB")
    monkeypatch.setenv("KVPROXY_TTL", "60")
    settings = Settings()
    assert (settings.ram_cache_bytes, settings.ttl) == (64 * 2**20, 60)
    assert settings.blob_root == settings.cache_dir / "blobs"
    monkeypatch.setenv("KVPROXY_TTL", "0")
    with pytest.raises(ValidationError):
        Settings()
