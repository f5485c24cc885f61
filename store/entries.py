"""What the index records: one entry per block, and the block's name (its *member*) in the index."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from hashing import BlockHash, Namespace


@dataclass(frozen=True)
class IndexEntry:
    """What the index knows of one block.

    Attributes:
        blob: blob path relative to the blob store root.
        size: size of the blob file in bytes (``"bytes"`` in the JSON).
        parent: hex hash of the previous block in the chain, or ``""`` for block 0.
        created: Unix time (seconds) the entry was published.
        imported: the block came from a snapshot and waits for its audit (``--audit-imports``):
            lookups never serve it until the audit confirms it (``BlockIndex.promote``).
        tail: for a tail (``hashing.tails``), its length in tokens; 0 for a block. A tail's
            ``parent`` is its tip (``""``: the namespace root).
    """

    blob: str
    size: int
    parent: str
    created: float
    imported: bool = False
    tail: int = 0

    def to_json(self) -> str:
        doc: dict[str, object] = {"blob": self.blob, "bytes": self.size, "parent": self.parent}
        doc |= {"created": self.created} | ({"imported": True} if self.imported else {})
        return json.dumps(doc | ({"tail": self.tail} if self.tail else {}))

    @classmethod
    def from_json(cls, raw: bytes | str) -> IndexEntry:
        doc = json.loads(raw)
        fields = str(doc["blob"]), int(doc["bytes"]), str(doc["parent"]), float(doc["created"])
        return cls(*fields, imported=doc.get("imported") is True, tail=int(doc.get("tail", 0)))


def member_name(namespace: Namespace, block_hash: BlockHash) -> str:
    """A block's name in the index, ``{namespace_hex}:b:{hash_hex}``."""
    return f"{namespace.hex()}:b:{block_hash.hex()}"


def parse_member(member: str) -> tuple[Namespace, BlockHash]:
    """Inverse of ``member_name``.

    Raises:
        ValueError: not a member name.
    """
    ns_hex, kind, hash_hex = member.split(":")
    if kind != "b":
        raise ValueError(member)
    return Namespace(bytes.fromhex(ns_hex)), BlockHash(bytes.fromhex(hash_hex))


def new_entry(
    blob: str, size: int, parent: BlockHash | None, imported: bool = False, tail: int = 0
) -> IndexEntry:
    """An entry for a blob just written, created now."""
    return IndexEntry(blob, size, parent.hex() if parent is not None else "", time.time(), imported, tail)
