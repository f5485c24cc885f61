"""The prefix KV cache: a Redis index of blocks plus a safetensors blob store.

``store.interface`` holds the contracts (``PrefixCache`` for the engine, ``CacheAdmin`` for the
server) and value types; ``store.outcomes`` the typed outcomes; ``store.cache.BlockCache`` is the
facade over the parts (index, blobs, serde, RAM tier, lookup, writer, gc).
"""

from store.admin_interface import CacheAdmin
from store.interface import KVBlock, KVSpec, PrefixCache, PrefixMatch
from store.outcomes import CacheKind, EvictionReason, MissReason
from store.stats import CacheStats, GcReport

__all__ = [
    "CacheAdmin",
    "CacheKind",
    "CacheStats",
    "EvictionReason",
    "GcReport",
    "KVBlock",
    "KVSpec",
    "MissReason",
    "PrefixCache",
    "PrefixMatch",
]
