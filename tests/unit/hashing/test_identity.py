"""hashing/identity.py: one value names a namespace; every field is part of its digest, and the
manifest form carries each field under one name."""

from __future__ import annotations

import dataclasses

import pytest

from hashing import NamespaceIdentity

BASE = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t")
CHANGED = {
    "model_fingerprint": "other",
    "kv_dtype": "bfloat16",
    "tenant": "u",
    "weights": "q4_1",
    "device": "cuda",
    "block_size": 64,
    "format_version": 99,
    "block_format": "int8",
}


def test_every_field_is_changed_here() -> None:
    """The table below covers every field of the identity (a new field needs a row)."""
    assert set(CHANGED) == {f.name for f in dataclasses.fields(NamespaceIdentity)}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_change_to_any_field_changes_the_digest(name: str) -> None:
    """Two identities that differ in one field never share a namespace."""
    other = dataclasses.replace(BASE, **{name: CHANGED[name]})
    assert other.digest() != BASE.digest()
    assert BASE.differs_from(other.manifest()) is not None


def test_the_digest_is_the_documented_canonical_json() -> None:
    """The digest is pinned: xxh3_128 of the sorted, space-free JSON of the fields, the values the
    earlier ``namespace_digest`` gave (a change here would orphan every stored block)."""
    assert BASE.digest().hex() == "81aaa58db0a72d2753ea1ef5d5ec5df9"
    other = dataclasses.replace(BASE, weights="int4", device="cuda")
    assert other.digest().hex() == "fff25075dabf3c000d550ad31e272b34"


def test_the_manifest_form_round_trips() -> None:
    """A manifest names every field (``format_version`` as ``block_format_version``) and the digest;
    the identity it was made from finds no difference, and for_tenant changes the tenant only."""
    manifest = BASE.manifest()
    assert manifest["block_format_version"] == BASE.format_version and "format_version" not in manifest
    assert manifest["namespace"] == BASE.digest().hex()
    assert BASE.differs_from(manifest) is None
    assert BASE.differs_from(manifest | {"block_size": "128"}) == "block_size"  # a type differs too
    assert BASE.for_tenant("u") == dataclasses.replace(BASE, tenant="u")


def test_an_exact_identity_and_manifest_are_those_before_block_formats() -> None:
    """``block_format`` is left out of an exact identity's digest (the pinned digest above holds),
    and a manifest written before the field existed reads as exact."""
    old = {k: v for k, v in BASE.manifest().items() if k != "block_format"}
    assert BASE.differs_from(old) is None
    assert dataclasses.replace(BASE, block_format="int8").differs_from(old) == "block_format"
