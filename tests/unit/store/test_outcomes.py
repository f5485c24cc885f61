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


@pytest.mark.parametrize(
    ("n", "blocks", "cached", "kind", "first"),
    [
        (100, 0, 99, "hit", (None, None)),  # a tail at the root served all but the last token
        (100, 0, 40, "partial", (0, MissReason.BELOW_ONE_BLOCK)),
        (300, 2, 299, "hit", (None, None)),  # blocks, then a tail
        (300, 2, 256, "hit", (2, MissReason.PARTIAL_LAST_BLOCK)),  # no tail continued them
        (300, 1, 200, "partial", (1, MissReason.NEVER_SEEN)),  # a tail after block 0
        (300, 0, 0, "miss", (0, MissReason.NEVER_SEEN)),
    ],
)
def test_tails_count_in_the_kind_and_the_first_miss(n, blocks, cached, kind, first) -> None:
    assert cache_kind(n, blocks, cached) == kind
    assert first_miss(n, blocks, None, cached) == first
