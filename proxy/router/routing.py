"""The router's state and decisions: identity -> route index lookup -> loads -> choice, and what it
records afterwards. Redis calls run off the event loop, behind a circuit breaker: with Redis down
the router keeps routing on its own in-flight counts (``/health`` says ``degraded``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import xxhash

from hashing import BlockHash
from proxy.router.identity import Identity, PromptKey
from proxy.router.index import RouteIndex
from proxy.router.metrics import RouterMetrics
from proxy.router.policy import Choice, Endpoint, Thresholds, choose
from proxy.router.replicas import Replica, Replicas, probe_key
from proxy.router.settings import RouteSettings
from store.breaker import CircuitBreaker
from store.index.redis.connect import REDIS_ERRORS, redact_url
from store.index.redis.faults import RedisPlace, redis_fault

log = logging.getLogger("route")
T = TypeVar("T")
LOCAL_RESPONSES = 10_000
"""Where responses, named caches and cache keys are, remembered in this process (the latest)."""
TENANT_LOCAL = LOCAL_RESPONSES // 4
"""The most of them one tenant has remembered here (a quarter, as ``--tenant-share``'s default):
past it, a tenant's own oldest go, never another's."""
PROMPT_CACHE_KEY = "prompt_cache_key:"
"""Where a ``prompt_cache_key``'s replica is remembered: beside the response ids (never such a
name), per tenant, for ``--route-ttl``; by its digest (``cache_key_digest``), never the key."""


def cache_key_digest(cache_key: str) -> str:
    """A ``prompt_cache_key`` as the router keeps it, in memory and in Redis: 32 hex digits of its
    xxh3-128 (a key is the client's, of any length; a collision only moves a preference)."""
    return xxhash.xxh3_128_hexdigest(cache_key.encode())


class Router:
    """Everything one ``kvproxy route`` process knows (see the module docstring).

    Args:
        index: the shared route index, or None to route on local counts alone.
        identity: how request bodies become block hashes.
    """

    def __init__(self, settings: RouteSettings, index: RouteIndex | None, identity: Identity) -> None:
        self.settings, self.index, self.identity = settings, index, identity
        self.replicas = Replicas(
            settings.upstreams,
            settings.connect_timeout,
            settings.replica_cooldown,
            probe_key(settings.api_keys),
        )
        self.metrics = RouterMetrics([r.url for r in self.replicas.all])
        self.thresholds = Thresholds(
            settings.balance_abs_threshold,
            settings.balance_rel_threshold,
            settings.route_min_match_tokens,
            settings.route_min_match_fraction,
        )
        self.breaker = CircuitBreaker(settings.redis_retry)
        self.rng = random.Random()
        self.turn = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.responses: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(tenant, response id) -> the replica that answered it, the latest ``LOCAL_RESPONSES``:
        affinity while Redis is off or down."""
        self.own: dict[str, OrderedDict[str, None]] = {}
        """tenant -> its ids in ``responses``, oldest first (``TENANT_LOCAL``)."""

    @property
    def redis_ok(self) -> bool:
        return self.index is not None and self.breaker.allow()

    async def choose(
        self, kind: Endpoint, key: PromptKey, model: str | None, exclude: set[str], prefer: str | None = None
    ) -> Choice | None:
        """The replica for a request (None: no replica is up); ``prefer``: the replica known to
        hold its prefix (the one that answered the response it continues), held to hold all of it."""
        candidates = self.replicas.candidates(model, exclude)
        if not candidates:
            return None
        epochs = {r.url: r.epoch for r in candidates}
        blocks: dict[str, int] = {}
        loads: dict[str, int] = dict(self.replicas.inflight)
        if self.settings.policy == "cache-aware" and self.index is not None:
            ttl = self.settings.route_ttl
            blocks = await self._redis(self.index.match, key.namespace, key.hashes, epochs, ttl) or {}
        if self.settings.policy != "round-robin" and self.index is not None:
            loads = (await self._redis(self.index.loads)) or loads
        matched = {r: n * key.tokens_per_block for r, n in blocks.items()}
        if prefer in epochs:
            matched[prefer] = max(matched.get(prefer, 0), key.prompt_tokens, self.thresholds.min_match_tokens)
        self.turn += 1
        urls = [r.url for r in candidates]
        choice = choose(
            self.settings.policy,
            urls,
            matched,
            loads,
            key.prompt_tokens,
            self.thresholds,
            self.turn,
            self.rng,
        )
        # NOTE: a continuation's prompt is held whole, however short its new input (the router's count)
        choice = dataclasses.replace(choice, predicted_tokens=min(choice.predicted_tokens, key.prompt_tokens))
        log.debug(
            "%s -> %s (%s, %d tokens held)", kind, choice.replica, choice.decision, choice.predicted_tokens
        )
        return choice

    def started(self, replica: Replica) -> None:
        """A request goes to ``replica``: count it in flight, here at once and in the shared index
        in the background."""
        self._count(replica, 1)

    def ended(self, replica: Replica) -> None:
        """The request to ``replica`` ended, on whatever path (also when the client left)."""
        self._count(replica, -1)

    def _count(self, replica: Replica, delta: int) -> None:
        self.replicas.inflight[replica.url] += delta
        self.metrics.inflight.labels(replica.url).set(self.replicas.inflight[replica.url])
        if self.index is not None:
            self.spawn(self._redis(self.index.add_inflight, replica.url, delta))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background; it outlives the request (a client that leaves)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def record(self, replica: Replica, key: PromptKey, hashes: list[BlockHash]) -> None:
        """``replica`` was sent (or has answered) the blocks ``hashes`` of ``key``'s namespace."""
        if self.index is not None and hashes:
            ttl = self.settings.route_ttl
            await self._redis(self.index.record, key.namespace, hashes, replica.url, replica.epoch, ttl)

    async def remember_response(
        self, tenant: str, response_id: str, replica: Replica, ttl_s: int | None = None
    ) -> None:
        """``replica`` answered ``tenant``'s response ``response_id`` (or holds what that id
        names, such as a named cache): its continuations go there. Remembered for ``ttl_s``
        seconds (``--route-ttl`` by default) in the shared index, and here the latest
        ``LOCAL_RESPONSES`` (for as long as Redis is off or down)."""
        self._remember_here(tenant, response_id, replica.url)
        if self.index is not None:
            ttl = self.settings.route_ttl if ttl_s is None else ttl_s
            await self._redis(self.index.remember_response, tenant, response_id, replica.url, ttl)

    def _remember_here(self, tenant: str, response_id: str, url: str) -> None:
        """Remember in this process: the latest ``LOCAL_RESPONSES``, at most ``TENANT_LOCAL`` of
        one tenant (past that, its own oldest go first)."""
        self.responses.pop((tenant, response_id), None)
        self.responses[(tenant, response_id)] = url
        own = self.own.setdefault(tenant, OrderedDict())
        own.pop(response_id, None)
        own[response_id] = None
        while len(own) > TENANT_LOCAL:
            self.responses.pop((tenant, own.popitem(last=False)[0]), None)
        while len(self.responses) > LOCAL_RESPONSES:
            (who, oldest), _ = self.responses.popitem(last=False)
            self.own[who].pop(oldest, None)
            if not self.own[who]:
                del self.own[who]

    async def forget_response(self, tenant: str, response_id: str) -> None:
        """Forget where ``tenant``'s ``response_id`` is (it was deleted)."""
        self.responses.pop((tenant, response_id), None)
        if (own := self.own.get(tenant)) is not None:
            own.pop(response_id, None)
        if self.index is not None:
            await self._redis(self.index.forget_response, tenant, response_id)

    async def response_replica(self, tenant: str, response_id: str) -> str | None:
        """The replica that answered ``tenant``'s response ``response_id``, if known."""
        found = None
        if self.index is not None:
            found = await self._redis(self.index.response_replica, tenant, response_id)
        return found or self.responses.get((tenant, response_id))

    async def key_replica(self, tenant: str, cache_key: str) -> str | None:
        """The replica that last answered ``tenant``'s requests with ``prompt_cache_key``
        ``cache_key``, if known (remembered as ``remember_key`` left it)."""
        return await self.response_replica(tenant, PROMPT_CACHE_KEY + cache_key_digest(cache_key))

    async def remember_key(self, tenant: str, cache_key: str, replica: Replica) -> None:
        """``replica`` answered a request of ``tenant``'s with ``prompt_cache_key`` ``cache_key``:
        the key's next requests go there, within the load limits (``choose``'s ``prefer``)."""
        await self.remember_response(tenant, PROMPT_CACHE_KEY + cache_key_digest(cache_key), replica)

    async def probe_forever(self) -> None:
        """Probe every replica's health each ``--health-interval`` seconds; heartbeat the index."""
        while True:
            await self.probe_all()
            await asyncio.sleep(self.settings.health_interval)

    async def probe_all(self) -> None:
        results = await asyncio.gather(*(self.replicas.probe(r) for r in self.replicas.all))
        if self.index is not None:
            await self._redis(self.index.heartbeat)
            epochs = await self._redis(self.index.epochs, [r.url for r in self.replicas.all]) or {}
        for replica, (up, restarted) in zip(self.replicas.all, results, strict=True):
            if restarted and self.index is not None:
                replica.epoch = await self._redis(self.index.bump_epoch, replica.url) or replica.epoch + 1
                log.info("replica %s is back (epoch %d)", replica.url, replica.epoch)
            elif self.index is not None:
                replica.epoch = epochs.get(replica.url, replica.epoch)
            if up and not replica.up:
                log.info("replica %s answers again", replica.url)
            if not up and replica.up:
                log.warning("replica %s is down", replica.url)
            if up:
                replica.breaker.success()
            replica.up, replica.probed = up, True
            self.metrics.up.labels(replica.url).set(1 if replica.available else 0)

    async def _redis(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)`` in a thread, or None when Redis is failing (the breaker opens)."""
        if not self.breaker.allow():
            return None
        try:
            result = await asyncio.to_thread(fn, *args)
        except REDIS_ERRORS as exc:
            if self.breaker.failure():
                place = RedisPlace(redact_url(self.settings.redis_url), self.settings.redis_timeout)
                log.warning("%s. Routing on local counts until it answers.", redis_fault(exc, place))
            return None
        if self.breaker.success():
            log.info("Redis answers again: shared routing resumed")
        return result

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.index is not None:
            await self._redis(self.index.clear)
        await self.replicas.close()
