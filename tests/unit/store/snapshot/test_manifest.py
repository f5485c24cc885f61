"""store/snapshot/format.py: a manifest and its block entries are checked before anything is read,
and every fault names what is wrong."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from store.serde import BlockVerificationError
from store.snapshot.format import (
    KIND,
    MANIFEST,
    SNAPSHOT_VERSION,
    SnapshotError,
    add_member,
    depth,
    manifest_entry,
    read_manifest,
)

GOOD = {"kind": KIND, "snapshot_version": SNAPSHOT_VERSION, "tenant": "default", "blocks": []}
ENTRY = {"hash": "ab" * 16, "parent": None, "index": 0, "xxh3_128": "00" * 16, "bytes": 100}


def archive(manifest: object | None, raw: bytes | None = None) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if manifest is not None or raw is not None:
            add_member(tar, MANIFEST, raw if raw is not None else json.dumps(manifest).encode())
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:")


def test_a_good_manifest_reads_back() -> None:
    """Kind, version, a tenant and a list of blocks: accepted as written."""
    assert read_manifest(archive(GOOD)) == GOOD


@pytest.mark.parametrize(
    ("manifest", "raw", "says"),
    [
        (None, None, "no readable manifest.json"),
        (None, b"{not json", "no readable manifest.json"),
        (None, b"[" * 100_000, "no readable manifest.json"),  # nested too deep
        (GOOD | {"kind": "other"}, None, "is not of kind"),
        (GOOD | {"snapshot_version": 2}, None, "snapshot_version 2 differs"),
        (GOOD | {"snapshot_version": True}, None, "snapshot_version True differs"),
        ({k: v for k, v in GOOD.items() if k != "tenant"}, None, "names no tenant"),
        (GOOD | {"tenant": 7}, None, "names no tenant"),
        (GOOD | {"blocks": {}}, None, "`blocks` is not a list"),
    ],
)
def test_a_bad_manifest_is_refused_naming_why(manifest: object, raw: bytes | None, says: str) -> None:
    """Each malformed manifest raises SnapshotError with a message naming the fault."""
    with pytest.raises(SnapshotError, match=says):
        read_manifest(archive(manifest, raw))


def test_a_good_entry_is_parsed() -> None:
    """Hash and parent as 16 bytes (no parent: block 0), position, digest and size."""
    entry = manifest_entry(ENTRY | {"parent": "cd" * 16, "index": 1})
    assert (entry.block_hash.hex(), entry.parent.hex() if entry.parent else None) == ("ab" * 16, "cd" * 16)
    assert (entry.position, entry.size) == (1, 100)
    assert manifest_entry(ENTRY).parent is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"hash": "AB" * 16}, "`hash` or `parent`"),
        ({"parent": "short"}, "`hash` or `parent`"),
        ({"index": -1}, "`index`"),
        ({"index": True}, "`index`"),
        ({"xxh3_128": None}, "`xxh3_128`"),
        ({"bytes": "100"}, "`bytes`"),
        ({"bytes": -5}, "`bytes`"),
    ],
)
def test_a_bad_entry_names_its_field(change: dict[str, object], says: str) -> None:
    """A malformed entry is a verification error naming the field."""
    with pytest.raises(BlockVerificationError, match=says):
        manifest_entry(ENTRY | change)


def test_entries_that_are_not_objects_sort_first_and_are_refused() -> None:
    """Parents before children: entries by index, anything malformed first."""
    assert sorted([ENTRY | {"index": 2}, "junk", ENTRY], key=depth) == ["junk", ENTRY, ENTRY | {"index": 2}]
    with pytest.raises(BlockVerificationError, match="not an object"):
        manifest_entry("junk")
