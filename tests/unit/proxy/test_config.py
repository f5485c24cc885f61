"""proxy/config.py: sizes with units, settings from the environment, where blobs live."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import Settings
from proxy.flags import load_settings
from proxy.router.settings import RouteSettings
from proxy.setting_values import parse_bytes
from proxy.stores import blob_budget, open_blobs
from store.blobs.s3 import S3BlobStore


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


def test_a_flag_wins_over_its_environment_variable(monkeypatch) -> None:
    """KVPROXY_TTL=60 and --ttl 5: 5; without the flag (click passes None): 60."""
    monkeypatch.setenv("KVPROXY_TTL", "60")
    assert (load_settings(ttl=5).ttl, load_settings(ttl=None).ttl) == (5, 60)


def test_blob_url_names_a_directory_or_a_bucket(tmp_path) -> None:
    """file:///path is --blob-dir by another name; s3://bucket/prefix opens the S3 backend."""
    as_file = Settings(blob_url=f"file://{tmp_path}/blobs")
    assert as_file.blob_root == tmp_path / "blobs"
    assert as_file.blob_location == Settings(blob_dir=tmp_path / "blobs").blob_location
    assert open_blobs(as_file).url == (tmp_path / "blobs").as_uri()
    on_s3 = open_blobs(Settings(blob_url="s3://bucket/some/prefix/"))
    assert isinstance(on_s3, S3BlobStore) and (on_s3.bucket, on_s3.prefix) == ("bucket", "some/prefix/")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"blob_url": "s3://b/p", "blob_dir": "/tmp/x"}, "not both"),
        ({"blob_url": "gs://b/p"}, "neither file:///path nor s3://bucket/prefix"),
        ({"blob_url": "s3:///p"}, "neither"),
        ({"blob_url": "file://relative/dir"}, "neither"),
    ],
)
def test_a_bad_blob_location_fails_at_start_up(flags, message) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**flags)


def test_blobs_on_s3_need_a_byte_budget() -> None:
    """No free disk to take half of: the error names --max-cache-bytes."""
    with pytest.raises(ValueError, match="--max-cache-bytes"):
        blob_budget(Settings(blob_url="s3://bucket/kvp"))
    assert blob_budget(Settings(blob_url="s3://bucket/kvp", max_cache_bytes="2GB")) == 2 * 10**9


@pytest.mark.parametrize(
    ("upstream", "error"),
    [
        (",", "at least one"),
        ("http://a:1", "not an OpenAI base URL"),
        ("ftp://a/v1", "not an OpenAI base URL"),
    ],
)
def test_route_upstreams_are_openai_base_urls(upstream, error) -> None:
    """An empty list, a URL without ``/v1`` or another scheme stops the router at start."""
    with pytest.raises(ValidationError, match=error):
        RouteSettings(upstream=upstream)
    assert RouteSettings(upstream="http://a:1/v1/, https://b/x/v1").upstreams == [
        "http://a:1/v1",
        "https://b/x/v1",
    ]


@pytest.mark.parametrize("url", ["http://x:1", "redis+cluster://a", "redis+sentinel://a:1"])
def test_a_redis_url_that_cannot_work_is_refused(url) -> None:
    """Unknown schemes at start; a cluster node without a port or a sentinel URL without its
    service name when the client is made."""
    from store.index.redis.connect import RedisURLError, redis_client

    with pytest.raises((ValidationError, RedisURLError)):
        redis_client(Settings(redis_url=url).redis_url, 0.1)
