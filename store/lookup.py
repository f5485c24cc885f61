"""The lookup: a prompt's longest cached prefix, matched, read and verified within a bounded time.

One Redis round trip lists the leading blocks the index holds (refreshing their TTL and LRU
position); each is then taken from the RAM tier or read from the blob store and verified (every
blob asked for at once), served in chain order, and blocks this process is still saving extend
the prefix. The prefix ends at the
first block that cannot be served, for a typed reason (``MissReason``). Then the longest tail
(``hashing.tails``) that continues the prompt after those blocks, listed by the same round trip
or still being saved, extends it to the token; a tail is verified like a block.

Blob reads and their verification run on daemon threads of their own (``store.readers``; one
decode at a time, the codec's own threads sharing the cores): a read that hangs in the kernel (a
stuck network mount) holds one of them, never the caller, which gives up after ``read_timeout_s``
and serves the blocks verified so far.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from time import monotonic, perf_counter
from typing import cast

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes, block_tokens, reusable_tokens
from store.index.base import TailListing
from store.interface import KVBlock, KVSpec, PrefixMatch, TtlPlan, block_ttls
from store.outcomes import MissReason
from store.parts import CacheOptions, StoreParts
from store.ram import PendingView
from store.readers import ReaderPool, cancel
from store.serde import decode_block, read_bound
from store.tails import DAMAGED, TailFinder, candidate_tails
from store.writer import BlockWriter

log = logging.getLogger(__name__)


class PrefixLookup:
    """Finds, reads and verifies cached prefixes (see the module docstring).

    Args:
        parts: the cache's shared parts.
        writer: the writer, whose pending blocks extend a prefix and whose thread counts hits.
        spec: the shape and dtype every block must have.
        options: ``ttl_s`` (the default TTL a hit refreshes its blocks to), ``read_timeout_s``
            (most seconds one lookup waits for blob reads), ``pin_memory`` and ``tails``.
        readers: blob reads that may run (or hang) at once.
    """

    def __init__(
        self, parts: StoreParts, writer: BlockWriter, spec: KVSpec, options: CacheOptions, readers: int = 8
    ) -> None:
        self.parts, self.writer, self.spec = parts, writer, spec
        self.ttl_s, self.read_timeout_s, self.pin_memory = (
            options.ttl_s,
            options.read_timeout_s,
            options.pin_memory,
        )
        self.tails = options.tails
        self._readers = ReaderPool(readers)
        self._decoding = threading.Lock()
        self._tails = TailFinder(parts, writer, spec, self._readers.submit, self.discard, self.ttl_s)

    def lookup(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        max_blocks: int | None,
        ttl_s: TtlPlan,
        count: bool = True,
    ) -> PrefixMatch:
        """See ``PrefixCache.lookup``."""
        limit = len(token_ids) if max_blocks is None else max_blocks * BLOCK_SIZE
        hashes = block_hashes(token_ids[:limit], namespace)
        deadline = monotonic() + self.read_timeout_s
        with_tail = max_blocks is None and self.tails
        candidates = candidate_tails(namespace, token_ids, hashes) if with_tail else []
        pending = self.writer.pending.view(namespace, hashes)
        match, listed = self._match(namespace, token_ids, hashes, ttl_s, deadline, candidates, pending)
        if with_tail:
            found = (listed, pending.tails)
            match = self._tails.extend(namespace, token_ids, hashes, match, found, ttl_s, deadline)
        if not count:
            return match
        cached = reusable_tokens(len(token_ids), match.num_blocks) + match.tail_tokens
        self.parts.recorder.add(lookups=1, tokens_queried=len(token_ids), tokens_hit=cached)
        tails = {"tails_hit": int(match.tail is not None), "tail_tokens_hit": match.tail_tokens}
        self.parts.recorder.add(**tails)
        failures = int(match.miss_reason == MissReason.FAILED_VERIFICATION)
        # NOTE: a hit of blocks also counts for its prefix among the hot ones, in the same
        # background job
        blocks, hit = match.blocks, None
        if blocks:
            hit = partial(
                self.parts.hot.record,
                namespace,
                blocks[0].block_hash,
                blocks[-1].block_hash,
                len(blocks),
                cached,
            )
        self.writer.share(
            namespace,
            also=hit,
            prompt_tokens=len(token_ids),
            cached_tokens=cached,
            verification_failures=failures,
            **tails,
        )
        return match

    def _match(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        hashes: list[BlockHash],
        ttl_s: TtlPlan,
        deadline: float,
        candidates: list[BlockHash],
        pending: PendingView,
    ) -> tuple[PrefixMatch, list[TailListing]]:
        """The verified leading blocks, their blobs read by ``deadline`` (``time.monotonic``),
        then those of ``pending`` (the writer's, taken before the index round trip) that go on;
        and the tails the index lists after them, with the longest of ``candidates``
        (``candidate_tails``) it has when it has every block (none when the blocks served are not
        the ones it holds)."""
        ttls = block_ttls(ttl_s, len(hashes), self.ttl_s)
        found = self.parts.guard.redis(
            "match", self.parts.index.match, namespace, hashes, ttls, candidates, scope=namespace.hex()
        )
        if found is None:
            return PrefixMatch([], MissReason.UNAVAILABLE), []
        entries, seen, tails, candidate = found
        if candidate:
            short = candidates[candidate - 2] if candidate > 1 else None
            start = len(hashes) * BLOCK_SIZE
            exact = tuple(token_ids[start : start + candidate])
            tails = [*tails, TailListing(candidates[candidate - 1], candidate, short, exact)]
        listed = len(entries)
        reason: MissReason | None = None
        if len(entries) < len(hashes):
            reason = MissReason.EXPIRED if seen else MissReason.NEVER_SEEN
        # NOTE: an imported block waiting for its audit is never served (nor anything after it)
        unaudited = next((i for i, e in enumerate(entries) if e.imported), None)
        if unaudited is not None:
            entries, reason = entries[:unaudited], MissReason.UNAUDITED
        self.parts.recorder.add(blocks_matched=len(entries))

        blocks: list[KVBlock] = []
        from_ram = 0
        ids = [block_tokens(token_ids, i) for i in range(len(entries))]
        in_ram = [self.parts.ram.get(namespace, hashes[i]) for i in range(len(entries))]
        # NOTE: every blob the prefix needs is asked for at once, read and verified on the reader
        # threads, and served in chain order. The blob is named by our own hash, never by the
        # index entry, and verified against our own tokens: a wrong reply can only cause a miss.
        reads = {
            i: self._readers.submit(partial(self._read, namespace, hashes, i, ids[i]))
            for i, block in enumerate(in_ram)
            if block is None or block.token_ids != ids[i]
        }
        for i in range(len(entries)):
            read = reads.get(i)
            if read is None:
                blocks.append(cast(KVBlock, in_ram[i]))
                from_ram += 1
                continue
            try:
                block = read.result(timeout=max(0.0, deadline - monotonic()))
            except FutureTimeout:
                cancel(reads.values())
                self.parts.recorder.add(read_timeouts=1)
                self.parts.guard.warn(
                    "read", "a blob read took over %.1f s: served as a miss", self.read_timeout_s
                )
                return self._done(blocks, from_ram, MissReason.TIMED_OUT), []
            except DAMAGED as exc:
                # NOTE: the prefix ends at the first block we cannot serve; blocks after it are
                # never loaded, since their K/V depends on this one. Their index entries go too
                # (not their blobs): this request computes them again and its save writes any blob
                # that is gone, so a damage that took several (a namespace directory) heals at once
                cancel(reads.values())
                log.warning("cache block %d (%s) dropped: %s", i, hashes[i].hex(), exc)
                self.parts.recorder.add(verification_failures=1)
                self.discard(namespace, [hashes[i]])
                for later in hashes[i + 1 : len(entries)]:
                    self.parts.guard.redis(
                        "drop", self.parts.index.drop, namespace, later, scope=namespace.hex()
                    )
                return self._done(blocks, from_ram, MissReason.FAILED_VERIFICATION), []
            except OSError as exc:  # NOTE: not the blob's fault (a disk, a bucket): it is kept
                cancel(reads.values())
                self.parts.recorder.add(read_errors=1)
                self.parts.guard.warn("read", "a blob read failed (%s): served as a miss", exc)
                return self._done(blocks, from_ram, MissReason.READ_FAILED), []
            if self.pin_memory:
                # NOTE: page-locked, so the upload to an accelerator is asynchronous and fast
                block = dataclasses.replace(block, key=block.key.pin_memory(), value=block.value.pin_memory())
            self.parts.ram.put(namespace, block)
            blocks.append(block)

        # NOTE: blocks this process computed and is still saving extend the prefix the index
        # lists, so a request sent right after another one hits without waiting for the disk
        # (never past an imported block waiting for its audit).
        end = len(blocks) if reason == MissReason.UNAUDITED else len(hashes)
        for i in range(len(blocks), end):
            held = pending.blocks.get(hashes[i])
            if held is None or held.token_ids != block_tokens(token_ids, i):
                break
            blocks.append(held)
            from_ram += 1
        done = self._done(blocks, from_ram, None if len(blocks) == len(hashes) else reason)
        return done, tails if len(blocks) == listed else []

    def _read(self, namespace: Namespace, hashes: list[BlockHash], i: int, ids: tuple[int, ...]) -> KVBlock:
        """Block ``i`` of the chain ``hashes``, its blob read and verified against ``ids``.

        Raises:
            OSError: the blob cannot be read.
            BlockVerificationError: it is not the block.
        """
        parent = hashes[i - 1] if i else None

        def decode(data: bytes) -> tuple[KVBlock, int, float]:
            # NOTE: one decode at a time (the codec's own threads share the cores) while reads go on
            with self._decoding:
                started = perf_counter()
                block = decode_block(
                    data,
                    index=i,
                    block_hash=hashes[i],
                    parent=parent,
                    namespace=namespace,
                    token_ids=ids,
                    spec=self.spec,
                )
                return block, len(data), perf_counter() - started

        bound = read_bound(self.spec)
        block, size, seconds = self.parts.blobs.read_checked(namespace, hashes[i], decode, bound)
        self.parts.recorder.add_coded("decode", block, size, seconds)
        return block

    def _done(self, blocks: list[KVBlock], from_ram: int, reason: MissReason | None) -> PrefixMatch:
        self.parts.recorder.add(blocks_loaded=len(blocks), blocks_from_ram=from_ram)
        return PrefixMatch(blocks, reason)

    @property
    def readers(self) -> ReaderPool:
        """The reader threads (shared with the explanations' reads, ``StoreAdmin``)."""
        return self._readers

    def discard(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Remove blocks that must not be served: each one's RAM copy, index entry, then blob (so
        the next save writes it afresh)."""
        for block_hash in hashes:
            self.parts.ram.drop(namespace, block_hash)
            self.parts.guard.redis(
                "drop", self.parts.index.drop, namespace, block_hash, scope=namespace.hex()
            )
            try:
                self.parts.blobs.delete(namespace, block_hash)
            except OSError as exc:
                self.parts.guard.warn("delete", "cannot delete bad blob %s: %s", block_hash.hex(), exc)
