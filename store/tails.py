"""The tail of a lookup: after a prompt's cached blocks, the tail (``hashing.tails``) that serves
the most of it, to the token.

Candidates are the tails this process is still saving after the blocks' tip (as the writer held
them when the lookup began), and those the index has there, in the lookup's one round trip: the
tails listed after the tip, and, when every block of the prompt is cached, the longest tail that
continues it exactly (``candidate_tails``: named by the prompt's own tokens, so it is found
however many tails share the tip). A tail serves its longest common prefix with the prompt
(``hashing.shared_tokens``; a listed tail's ids come with its listing), never more than the
prompt's last token but one: a history that renders a generated answer with other tokens than
were sampled reuses the answer up to the first token that differs. A listed tail is taken from
the RAM tier or read and verified like a block (``store.serde.decode_tail``: the tokens it
serves, and the name of all it holds); one that does not verify is dropped and the prompt goes
on without it. The served tail's TTL and LRU position are refreshed in the background.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from time import monotonic, perf_counter
from typing import Any

from hashing import BLOCK_SIZE, BlockHash, Namespace, shared_tokens, tail_hash
from store.blobs.base import NotABlob
from store.index.base import TailListing
from store.interface import KVBlock, KVSpec, PrefixMatch, TtlPlan, block_ttls
from store.outcomes import MissReason
from store.parts import StoreParts
from store.serde import BlockVerificationError, decode_tail, read_bound
from store.writer import BlockWriter

log = logging.getLogger(__name__)

DAMAGED = (FileNotFoundError, NotABlob, BlockVerificationError)
"""A read's faults that are the blob's own (gone, no blob, not the block): it is dropped, with its
index entry. Any other ``OSError`` (a disk, a bucket) is a miss that keeps both."""
UNREAD = (MissReason.TIMED_OUT, MissReason.READ_FAILED, MissReason.UNAVAILABLE)
"""Why a lookup stopped without reading what comes next: no tail is looked for then."""


class TailFinder:
    """Extends a lookup's blocks with a tail (see the module docstring).

    Args:
        parts, writer, spec: the cache's parts, its writer (pending tails, background jobs) and
            the K/V shape every tail must have.
        read: submits a blob read, returning a future (the lookup's reader threads).
        discard: removes a tail that must not be served (RAM copy, index entry, blob).
        ttl_s: the default TTL (seconds) a hit refreshes a tail to.
    """

    def __init__(
        self,
        parts: StoreParts,
        writer: BlockWriter,
        spec: KVSpec,
        read: Callable[[Callable[[], Any]], Any],
        discard: Callable[[Namespace, Sequence[BlockHash]], None],
        ttl_s: int,
    ) -> None:
        self.parts, self.writer, self.spec, self.read, self.discard = parts, writer, spec, read, discard
        self.ttl_s = ttl_s

    def extend(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        hashes: list[BlockHash],
        match: PrefixMatch,
        tails: tuple[list[TailListing], dict[BlockHash | None, list[KVBlock]]],
        ttl_s: TtlPlan,
        deadline: float,
    ) -> PrefixMatch:
        """``match`` with the tail that serves the most of ``token_ids`` after its blocks
        (``hashes`` the prompt's block hashes; ``tails`` the ones the index listed after them and
        the writer's pending ones by tip, ``PendingView.tails``), its blob read by ``deadline``
        (``time.monotonic``: the lookup's bound)."""
        k = match.num_blocks
        start = k * BLOCK_SIZE
        room = min(BLOCK_SIZE - 1, len(token_ids) - 1 - start)
        if room <= 0 or match.miss_reason in UNREAD:
            return match
        tip = hashes[k - 1] if k else None
        rest = tuple(token_ids[start : start + room])
        listed, pending = tails
        match = match._replace(continuation=self._continuation(namespace, tip, token_ids[start:], tails))
        # NOTE: of the tails serving the most tokens, one still pending (nothing to read), then
        # the shortest (the fewest bytes to read): an answer's tail holds its prompt's tail too
        candidates: list[tuple[int, bool, int, KVBlock | TailListing]] = [
            (shared_tokens(t.token_ids, rest, room), True, -len(t.token_ids), t) for t in pending.get(tip, [])
        ]
        candidates += [(self._serves(namespace, tip, t, rest, room), False, -t.length, t) for t in listed]
        use, _, _, found = max(candidates, key=lambda c: c[:3], default=(0, False, 0, None))
        if not use or found is None:
            return match
        if isinstance(found, KVBlock):
            return match._replace(tail=found, tail_tokens=use)
        tail = self._read(namespace, tip, k, found, rest[:use], deadline)
        if isinstance(tail, MissReason):
            # NOTE: why the tokens after the blocks were not served, when the blocks did not stop
            # for a reason of their own: the tail that would have served them failed
            return match if match.miss_reason else match._replace(miss_reason=tail)
        ttl = block_ttls(ttl_s, k + 1, self.ttl_s)[k]
        touch = partial(self.parts.index.touch, namespace, tip, found.tail_hash, ttl, k)
        self.writer.enqueue(partial(self.parts.guard.redis, "touch", touch, scope=namespace.hex()))
        return match._replace(tail=tail, tail_tokens=use)

    def _continuation(
        self,
        namespace: Namespace,
        tip: BlockHash | None,
        rest: Sequence[int],
        tails: tuple[list[TailListing], dict[BlockHash | None, list[KVBlock]]],
    ) -> tuple[int, ...]:
        """The longest run of token ids a tail after ``tip`` holds past ``rest`` (the prompt's
        tokens after ``tip``, all of them), of the listed tails whose ids hash to their name and
        the pending ones; () when none holds all of ``rest``."""
        listed, pending = tails
        root = tip or namespace
        held = [t.token_ids for t in pending.get(tip, [])]
        held += [
            t.token_ids
            for t in listed
            if t.token_ids is not None
            and t.length > len(rest)
            and tail_hash(root, t.token_ids) == t.tail_hash
        ]
        n = len(rest)
        longer = [ids for ids in held if len(ids) > n and tuple(ids[:n]) == tuple(rest)]
        return tuple(max(longer, key=len)[n:]) if longer else ()

    def _serves(
        self,
        namespace: Namespace,
        tip: BlockHash | None,
        listing: TailListing,
        rest: tuple[int, ...],
        room: int,
    ) -> int:
        """Tokens of ``rest`` (the prompt after ``tip``) the listed tail would serve, at most
        ``room``: their common prefix with its token ids, as listed (when they hash to its name)
        or as its RAM copy holds them; else, by its names alone, all or all but its last."""
        root = tip or namespace
        ids = listing.token_ids
        if ids is None or len(ids) != listing.length or tail_hash(root, ids) != listing.tail_hash:
            held = self.parts.ram.get(namespace, listing.tail_hash)
            ids = held.token_ids if held is not None and len(held.token_ids) == listing.length else None
        if ids is not None:
            return shared_tokens(ids, rest, room)
        names = {listing.length: listing.tail_hash, listing.length - 1: listing.short_hash}
        for n in (listing.length, listing.length - 1):
            if 0 < n <= room and names[n] == tail_hash(root, rest[:n]):
                return n
        return 0

    def _read(
        self,
        namespace: Namespace,
        tip: BlockHash | None,
        index: int,
        listing: TailListing,
        ids: tuple[int, ...],
        deadline: float,
    ) -> KVBlock | MissReason:
        """The listed tail whose first ``len(ids)`` tokens are ``ids``, from RAM or read (by
        ``deadline``) and verified (a bad one is dropped); else why it cannot be served
        (``FAILED_VERIFICATION``: dropped, ``TIMED_OUT``, ``READ_FAILED``)."""
        block = self.parts.ram.get(namespace, listing.tail_hash)
        if (
            block is not None
            and len(block.token_ids) == listing.length
            and block.token_ids[: len(ids)] == ids
        ):
            return block

        def decode(data: bytes) -> tuple[KVBlock, int, float]:
            started = perf_counter()
            tail = decode_tail(
                data,
                index=index,
                tail=listing.tail_hash,
                tip=tip,
                namespace=namespace,
                length=listing.length,
                token_ids=ids,
                spec=self.spec,
            )
            return tail, len(data), perf_counter() - started

        bound = read_bound(self.spec)
        future = self.read(
            partial(self.parts.blobs.read_checked, namespace, listing.tail_hash, decode, bound)
        )
        try:
            decoded: tuple[KVBlock, int, float] = future.result(timeout=max(0.0, deadline - monotonic()))
        except FutureTimeout:
            future.cancel()
            self.parts.recorder.add(read_timeouts=1)
            return MissReason.TIMED_OUT
        except (OSError, BlockVerificationError) as exc:
            if not isinstance(exc, DAMAGED):
                self.parts.recorder.add(read_errors=1)  # NOTE: not the tail's fault: it is kept
                self.parts.guard.warn("read", "a tail read failed (%s): served without it", exc)
                return MissReason.READ_FAILED
            log.warning("cache tail %s dropped: %s", listing.tail_hash.hex(), exc)
            self.parts.recorder.add(verification_failures=1)
            self.discard(namespace, [listing.tail_hash])
            return MissReason.FAILED_VERIFICATION
        block, size, seconds = decoded
        self.parts.recorder.add_coded("decode", block, size, seconds)
        self.parts.ram.put(namespace, block)
        return block


def candidate_tails(
    namespace: Namespace, token_ids: Sequence[int], hashes: list[BlockHash]
) -> list[BlockHash]:
    """The names of the tails that would continue ``token_ids`` after all of its full blocks
    (``hashes``): element j - 1 names the next j tokens, for j up to 127 and to the prompt's end
    (a tail as long as the rest serves all of it but the last token)."""
    start = len(hashes) * BLOCK_SIZE
    tip = hashes[-1] if hashes else namespace
    rest = token_ids[start : start + BLOCK_SIZE - 1]
    return [tail_hash(tip, rest[:j]) for j in range(1, len(rest) + 1)]
