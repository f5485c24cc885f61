"""``NamespaceIdentity``: everything that must match for two requests to share K/V, in one value.

Its digest is the root of every block chain (docs/design.md, "Block identity"):
``N = xxh3_128(canonical JSON of {block_size, device, format_version, kv_dtype,
model_fingerprint, tenant, weights}, and block_format unless exact)``, canonical meaning sorted
keys, no spaces, UTF-8. The engine makes the value once per model
(``engine.model.loading.LoadedModel.identity``); the cache, a snapshot's manifest and its import
all take it from there, so the fields are written here only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import xxhash

from hashing.blocks import BLOCK_SIZE, FORMAT_VERSION, Namespace

MANIFEST_NAMES = {"format_version": "block_format_version"}
"""Fields whose name in a snapshot manifest differs (the manifest also holds the snapshot's own
``snapshot_version``)."""
MANIFEST_DEFAULTS = {"block_format": "exact"}
"""What a manifest written before a field existed means by its absence."""


@dataclass(frozen=True)
class NamespaceIdentity:
    """What makes K/V reusable: the model, the formats that computed it, the layout, the tenant.

    Attributes:
        model_fingerprint: digest of the model's weight files and config
            (``engine.model.resolve.model_fingerprint``): a changed checkpoint never reuses old K/V.
        kv_dtype: torch dtype name of the stored K/V, e.g. ``"float32"``.
        tenant: the tenant of the authenticated API key (never from the request body).
        weights: the weight format the decode step computes on (``"source"``, ``"full"``): K/V
            computed by one format is never reused by another.
        device: the kind of device that computed the K/V (``"cpu"``, ``"cuda"``): kernels differ.
        block_size: tokens per block.
        format_version: ``FORMAT_VERSION`` unless testing.
        block_format: how blocks are held at rest (``store.codec``): a lossy format's K/V is
            never served to another. Left out of the digest when ``"exact"``, so a store written
            before block formats keeps its namespace.
    """

    model_fingerprint: str
    kv_dtype: str
    tenant: str
    weights: str = "full"
    device: str = "cpu"
    block_size: int = BLOCK_SIZE
    format_version: int = FORMAT_VERSION
    block_format: str = "exact"

    def for_tenant(self, tenant: str) -> NamespaceIdentity:
        """The same model and formats, for ``tenant``."""
        return dataclasses.replace(self, tenant=tenant)

    def digest(self) -> Namespace:
        """The 16-byte namespace digest (computed once per value)."""
        return self._digest

    @cached_property
    def _digest(self) -> Namespace:
        doc = dataclasses.asdict(self)
        if doc["block_format"] == "exact":
            del doc["block_format"]
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return Namespace(xxhash.xxh3_128_digest(canonical.encode("utf-8")))

    def manifest(self) -> dict[str, str | int]:
        """The identity as a snapshot manifest writes it: every field (``format_version`` as
        ``block_format_version``) and ``namespace``, the digest in hex."""
        fields = {MANIFEST_NAMES.get(k, k): v for k, v in dataclasses.asdict(self).items()}
        return fields | {"namespace": self.digest().hex()}

    def differs_from(self, manifest: Mapping[str, object]) -> str | None:
        """The first manifest field whose value (or type) differs from this identity's, or None
        when the manifest's identity is this one (``namespace`` is compared last: its digest)."""
        mine = self.manifest()
        for name, value in mine.items():
            theirs = manifest.get(name, MANIFEST_DEFAULTS.get(name))
            if type(theirs) is not type(value) or theirs != value:
                return name
        return None
