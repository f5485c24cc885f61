"""The lookup stage: a request's cached prefix is matched, read, verified and copied into its K/V
buffers on threads of its own, before the request joins the batch with its past ready.

So the model thread never waits on Redis or the disk: one request's blob reads never delay the
other running requests' decode steps, and a read that hangs holds up only its own request, until
the cache gives up on it (``PrefixCache.lookup`` returns within a bounded time) and the request
is computed as a miss.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import torch

from engine.buffers import BufferPool
from engine.kv import past_from_blocks
from engine.model.loading import LoadedModel
from engine.sequence import LoadedPrefix, State
from engine.sequence import Sequence as Seq
from hashing import Namespace, reusable_tokens
from store.interface import PrefixCache, PrefixMatch, TtlPlan
from store.outcomes import MissReason

log = logging.getLogger(__name__)

INITIAL_ROOM_TOKENS = 1024
"""Completion tokens a request's K/V buffers have room for before they grow."""


def load_prefix(
    cache: PrefixCache | None,
    namespace: Namespace,
    prompt_ids: Sequence[int],
    buffers: tuple[torch.Tensor, torch.Tensor],
    ttl_s: TtlPlan = None,
    count: bool = True,
    kernels: ctypes.CDLL | None = None,
) -> LoadedPrefix:
    """Look up the longest cached prefix of ``prompt_ids`` and copy it into ``buffers`` (see
    ``engine.kv.past_from_blocks``, with ``kernels``); ``cache`` None is ``--no-cache``;
    ``count`` as in ``PrefixCache.lookup``."""
    match = PrefixMatch([], MissReason.DISABLED)
    if cache is not None:
        match = cache.lookup(namespace, prompt_ids, ttl_s=ttl_s, count=count)
    reused = reusable_tokens(len(prompt_ids), match.num_blocks)
    past = past_from_blocks(match.blocks, reused, buffers, kernels, match.tail, match.tail_tokens)
    reused += match.tail_tokens
    tail = match.tail.block_hash if match.tail is not None else None
    return LoadedPrefix(
        past, reused, match.num_blocks, match.miss_reason, match.tail_tokens, tail, match.continuation
    )


class PrefixLoader:
    """Runs the lookup stage of admitted sequences on ``threads`` daemon threads.

    Args:
        ready: called with each sequence once its past is ready (state ``PREFILLING``) or its
            stage failed (``error`` set); called on a loader thread.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PrefixCache | None,
        buffers: BufferPool,
        threads: int,
        ready: Callable[[Seq], None],
    ) -> None:
        self.loaded, self.cache, self.buffers, self.ready = loaded, cache, buffers, ready
        self._jobs: queue.SimpleQueue[Seq] = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._loop, name=f"kvproxy-loader-{i}", daemon=True).start()

    def load(self, seq: Seq) -> None:
        """Start the stage of an admitted sequence (returns at once)."""
        self._jobs.put(seq)

    def _loop(self) -> None:
        while True:
            seq = self._jobs.get()
            self.load_now(seq)
            self.ready(seq)

    def load_now(self, seq: Seq) -> None:
        """The stage of ``seq`` on this thread; a failure sets ``seq.error``."""
        try:
            self._load(seq)
        except Exception as exc:  # a bug must fail this request, not the stage
            log.exception("loading a cached prefix failed")
            seq.error = exc

    def _load(self, seq: Seq) -> None:
        request, start = seq.request, time.perf_counter()
        # NOTE: room for the usual completion; a longer one grows the past (one copy per doubling)
        seq.buffers = self.buffers.acquire(seq.n + min(request.max_tokens, INITIAL_ROOM_TOKENS))
        seq.prefix = load_prefix(
            self.cache,
            seq.namespace,
            request.prompt_ids,
            seq.buffers,
            request.cache_ttl_s,
            not request.prewarm,
            self.loaded.kernels,
        )
        seq.load_s = time.perf_counter() - start
        seq.state = State.PREFILLING
