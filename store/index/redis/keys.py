"""Where the index keeps what: the Redis keys of ``store.index.redis.index``, in one place.

Keys (under ``key_prefix``, default ``kvp:``). Every key of one namespace (a model, format and
tenant) carries the namespace as a Redis Cluster hash tag, ``{ns_hex}``, so a chain lookup, a
publish or an eviction touches one slot (one node, one round trip), while namespaces spread over
the cluster's nodes. A block's *member* name is ``{ns_hex}:b:{hash_hex}`` (no braces).

    ``{prefix}{{ns}}:b:{hash}``  JSON ``{"blob", "bytes", "parent", "created"}``, with a TTL (seconds)
    ``{prefix}{{ns}}:lru``       sorted set: member -> time of last use (seconds), the tail of a chain
                                 scored a little older than its head so it is evicted first
    ``{prefix}{{ns}}:sizes``     hash: member -> blob bytes, for every member of ``lru``
    ``{prefix}{{ns}}:bytes``     the sum of ``sizes``: what the namespace holds in the blob store
    ``{prefix}{{ns}}:s:{hash}``  "seen": a block was stored once (kept a week), to tell a miss on a
                                 block never seen from one on a block that expired or was evicted
    ``{prefix}{{ns}}:c:{parent_hex or "root"}``  set of child hashes, to find where a prompt diverged
    ``{prefix}{{ns}}:tails``     hash: tip hex (or ``root``) -> JSON list of the tails after it,
                                 ``[hash hex, tokens, short hash hex, expires at]`` (a tail's own
                                 entry is a ``b:`` key like a block's, with ``"tail"``: its tokens)
    ``{prefix}{{ns}}:pins``      hash: member -> how many named caches pin it (``store.index.pins``)
    ``{prefix}{{ns}}:pinned``    the sum of the pinned members' ``sizes`` (their own budget)
    ``{prefix}namespaces``       set of every namespace that ever published (for the global totals)
    ``{prefix}{{ns}}:hot``, ``:hot:hits``, ``:hot:root``  the namespace's hot prefixes: a sorted
                                 set of deepest block hashes by tokens saved, their hits, and
                                 their block 0 and length (``store.index.redis.hot``)
    (``store.index.redis.counters`` keeps a namespace's counters under ``{prefix}{{ns}}:stats`` and ``:tok:``,
    the deployment's under ``{prefix}stats`` and ``{prefix}tok:all:``)

What is global sums over namespaces: the bytes held (the byte budget) and the block count are the
sums of every namespace's counters, read in one pipelined round trip per node; eviction takes the
globally least recently used blocks, namespace by namespace (``evict``).

A ``key_prefix`` holding its own ``{...}`` puts every key in that one slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from hashing import BlockHash, Namespace


@dataclass(frozen=True)
class IndexKeys:
    """The key names under ``prefix``."""

    prefix: str

    @property
    def namespaces(self) -> str:
        return f"{self.prefix}namespaces"

    def of(self, ns_hex: str, rest: str) -> str:
        """A key of namespace ``ns_hex``: ``{prefix}{{ns}}:{rest}`` (hash-tagged)."""
        return f"{self.prefix}{{{ns_hex}}}:{rest}"

    def member(self, member: str) -> str:
        """The entry key of a member ``{ns}:b:{hash}``."""
        ns_hex, _, rest = member.partition(":")
        return self.of(ns_hex, rest)

    def block(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return self.of(namespace.hex(), f"b:{block_hash.hex()}")

    def seen(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return self.of(namespace.hex(), f"s:{block_hash.hex()}")

    def children(self, namespace: Namespace, parent: BlockHash | None) -> str:
        return self.of(namespace.hex(), f"c:{parent.hex() if parent is not None else 'root'}")

    def accounts(self, ns_hex: str) -> list[str]:
        """The namespace's LRU, sizes and bytes keys."""
        return [self.of(ns_hex, "lru"), self.of(ns_hex, "sizes"), self.of(ns_hex, "bytes")]

    def pins(self, ns_hex: str) -> list[str]:
        """The namespace's pins hash and pinned bytes (``store.index.redis.pins``)."""
        return [self.of(ns_hex, "pins"), self.of(ns_hex, "pinned")]
