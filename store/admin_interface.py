"""``CacheAdmin``: what the HTTP server and the command line read and administer of a cache
(the engine's side is ``store.interface.PrefixCache``). Implemented by ``store.admin.StoreAdmin``:
alone (no model needed) for the command line, and as ``store.cache.BlockCache.admin``, with
snapshots, for the server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import IO, Literal, Protocol

from hashing import BlockHash, Namespace, NamespaceIdentity
from store.index.base import Window
from store.snapshot.export import Manifest
from store.snapshot.importer import ImportReport
from store.stats import CacheStats, GcReport

CacheHealth = Literal["ok", "degraded", "disabled"]


@dataclass(frozen=True)
class Pinned:
    """What ``CacheAdmin.pin`` did (``store.index.pins.Pinning``): the chain's hashes, the
    bytes newly pinned, the bytes of its stored blocks, and how many are not stored yet."""

    block_hashes: list[BlockHash]
    added: int
    held: int
    missing: int


@dataclass(frozen=True)
class TokenWindow:
    """Tokens queried and hit over a window; ``hit_rate`` is None when nothing was queried."""

    queried_tokens: int
    hit_tokens: int
    hit_rate: float | None

    @classmethod
    def of(cls, window: Window) -> TokenWindow:
        return cls(window.queried, window.hit, window.hit_rate)


@dataclass(frozen=True)
class StoredNow:
    """What the whole deployment stores now: blocks and blob bytes, the bytes named caches pin,
    and blocks per retention class (``store.index.retention.RETENTION_CLASSES``)."""

    blocks: int
    bytes: int
    pinned_bytes: int
    blocks_by_retention: dict[str, int]


@dataclass(frozen=True)
class DeploymentStats:
    """``CacheAdmin.deployment_stats``: the shared counters (``totals``: counter name -> count, as
    ``store.index.base.Counters.totals`` reads them), the token hit rate over the last minute and
    hour, and (deployment scope only) ``stored``."""

    totals: dict[str, int]
    last_minute: TokenWindow
    last_hour: TokenWindow
    stored: StoredNow | None

    def as_dict(self) -> dict[str, int | dict[str, int | float | None]]:
        """As JSON: the totals, ``last_minute``, ``last_hour``, then ``stored``'s fields."""
        out = self.totals | {"last_minute": asdict(self.last_minute), "last_hour": asdict(self.last_hour)}
        return out | (asdict(self.stored) if self.stored is not None else {})


@dataclass(frozen=True)
class MinuteTokens:
    """Tokens queried and hit during one minute (``minute``: its start, Unix seconds)."""

    minute: int
    queried_tokens: int
    hit_tokens: int
    hit_rate: float | None


@dataclass(frozen=True)
class HotPrefixRow:
    """One of ``CacheAdmin.hot_prefixes``: its namespace (hex), hits, prompt tokens saved, length
    (``blocks``, ``cached_tokens``), ``bytes`` (blocks x its last block's blob bytes), seconds
    left to live (None: no expiry) and, for the readable namespace only, block 0's 128 token ids
    (None otherwise, or when they cannot be read)."""

    namespace: str
    hits: int
    tokens_saved: int
    blocks: int
    cached_tokens: int
    bytes: int
    ttl_seconds: int | None
    token_ids: list[int] | None


@dataclass(frozen=True)
class TenantRate:
    """One of ``CacheAdmin.tenant_rates``: a namespace (hex), its all-time prompt and cached
    tokens and hit rate (None: no prompt token), and its last hour."""

    namespace: str
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float | None
    last_hour: TokenWindow


class CacheAdmin(Protocol):
    """What the server and the command line read and administer. Every read answers None when
    Redis is unreachable (never raises for it); ``clear`` and the snapshots raise
    ``store.errors.StoreUnavailable`` so the caller can say so."""

    def health(self) -> CacheHealth:
        """``"ok"`` when the index answers, ``"degraded"`` while it does not."""
        ...

    def stats(self) -> CacheStats:
        """A snapshot of this process's counters."""
        ...

    def usage(self) -> tuple[int, int] | None:
        """``(blocks, bytes)`` the whole cache holds now."""
        ...

    def deployment_stats(self, namespace: Namespace | None = None) -> DeploymentStats | None:
        """Counters of every process sharing the index (or of one namespace), hit rates over the
        last minute and hour and, for the deployment, blocks and bytes stored."""
        ...

    def timeline(self, namespace: Namespace | None = None, minutes: int = 60) -> list[MinuteTokens] | None:
        """Tokens queried and hit per minute over the last ``minutes``."""
        ...

    def hot_prefixes(
        self, namespace: Namespace | None = None, readable: Namespace | None = None, n: int = 10
    ) -> list[HotPrefixRow] | None:
        """The ``n`` cached prefixes (of ``namespace``, or of all) that saved the most prompt
        tokens, most first; block 0's token ids (verified against its hash) for namespace
        ``readable`` only. Prefixes whose last block expired are left out (and forgotten)."""
        ...

    def tenant_rates(self, known: Sequence[Namespace] = ()) -> list[TenantRate] | None:
        """Per namespace that stored blocks (or is in ``known``) and has traffic, most prompt
        tokens first."""
        ...

    def pin(self, namespace: Namespace, token_ids: Sequence[int], ttl_s: int) -> Pinned | None:
        """Pin the full blocks of ``token_ids`` (a named cache's: ``store.index.pins.Pins``),
        stored ones for ``ttl_s`` seconds at least, the others as they are stored."""
        ...

    def unpin(self, namespace: Namespace, block_hashes: Sequence[BlockHash]) -> bool:
        """Release one pin of each block; False when Redis is unreachable (nothing released)."""
        ...

    def pinned_bytes(self) -> int | None:
        """Bytes pinned by named caches, over every namespace."""
        ...

    def divergence(
        self, namespace: Namespace, token_ids: Sequence[int], block: int
    ) -> tuple[int, list[int]] | None:
        """Where ``token_ids`` first differs from a cached sibling of its block ``block``:
        ``(token position, the sibling's token ids)``, or None."""
        ...

    def indexed_tokens(self, namespace: Namespace, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """How many leading full blocks of ``token_ids`` the index holds now, and the tokens of
        its tail (all of them after its full blocks) when the index holds that too, else 0 (no
        TTL refreshed, nothing counted, no blob read); None when the index is unreachable."""
        ...

    def gc(self, grace_s: float | None = None) -> GcReport | None:
        """Reconcile the index and the blob store now."""
        ...

    def clear(self, namespace_hex: str | None = None) -> int:
        """Remove every block (or one namespace's); returns how many indexed blocks went.

        Raises:
            store.errors.StoreUnavailable: the index failed.
        """
        ...

    def export_snapshot(
        self,
        out: IO[bytes],
        identity: NamespaceIdentity,
        prompts: Sequence[Sequence[int]] | None = None,
        model: str = "",
    ) -> Manifest:
        """Write a snapshot archive (``store.snapshot.format``) of the cached full blocks of
        ``prompts`` (token ids), or of every block of ``identity``'s namespace (None), to ``out``;
        the manifest records ``identity`` and the served name ``model``. Returns the manifest.

        Raises:
            store.errors.StoreUnavailable: the index failed.
        """
        ...

    def import_snapshot(
        self, source: IO[bytes], identities: Mapping[str, NamespaceIdentity], audit: bool = False
    ) -> ImportReport:
        """Store and index the blocks of a snapshot archive that verify (``store.snapshot``);
        ``identities`` holds this deployment's identity for each tenant it serves. With
        ``audit``, the blocks are served only once the engine has confirmed them
        (``ImportReport.chains``, ``PrefixCache.settle``).

        Raises:
            store.snapshot.format.SnapshotError: not a snapshot, one of another model or format,
                or of a tenant not in ``identities``.
            store.errors.StoreUnavailable: the index failed.
        """
        ...
