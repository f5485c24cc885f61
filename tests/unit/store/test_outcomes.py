"""store/outcomes.py: the kind of a request and the first block it missed, with its reason."""

from __future__ import annotations

import pytest

from store.outcomes import MissReason, cache_kind, first_miss


@pytest.mark.parametrize(
    ("n", "blocks", "kind"),
    [
        (100, 0, "miss"),
        (300, 0, "miss"),
        (300, 1, "partial"),
        (300, 2, "hit"),
        (256, 2, "hit"),
        (257, 2, "hit"),
    ],
)
def test_cache_kind(n: int, blocks: int, kind: str) -> None:
    """hit: every full block cached; partial: some; miss: none (and always under one block)."""
    assert cache_kind(n, blocks) == kind


@pytest.mark.parametrize(
    ("n", "blocks", "reason", "expected"),
    [
        (100, 0, MissReason.DISABLED, (0, MissReason.BELOW_ONE_BLOCK)),  # nothing to look up
        (300, 1, MissReason.EXPIRED, (1, MissReason.EXPIRED)),  # the lookup's own reason
        (300, 0, None, (0, MissReason.NEVER_SEEN)),
        (300, 2, None, (2, MissReason.PARTIAL_LAST_BLOCK)),  # tokens 256..299 are never cached
        (256, 2, None, (None, None)),  # all but the last token came from the cache
    ],
)
def test_first_miss(n, blocks, reason, expected) -> None:
    assert first_miss(n, blocks, reason) == expected


def test_reasons_read_as_their_values() -> None:
    """The enum is what JSON, headers and metric labels carry, unchanged."""
    assert f"{MissReason.TIMED_OUT}" == "read timed out" and MissReason.EXPIRED == "expired or evicted"
