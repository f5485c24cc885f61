"""store/entries.py: what the index records, and a block's member name."""

from __future__ import annotations

import pytest

from hashing import BlockHash
from store.entries import IndexEntry, member_name, new_entry, parse_member
from tests.helpers import NS


def test_member_names_round_trip() -> None:
    h = BlockHash(bytes(range(16)))
    member = member_name(NS, h)
    assert member == f"{NS.hex()}:b:{h.hex()}" and parse_member(member) == (NS, h)
    with pytest.raises(ValueError):
        parse_member(f"{NS.hex()}:s:{h.hex()}")


def test_entries_are_small_json() -> None:
    entry = new_entry("ns/ab/abcd.safetensors", 5_900_000, BlockHash(b"\x01" * 16))
    assert IndexEntry.from_json(entry.to_json()) == entry
    assert entry.parent == "01" * 16 and new_entry("x", 1, None).parent == ""
    assert len(entry.to_json()) < 200
