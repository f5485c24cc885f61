"""The replicas behind the router: one keep-alive ``httpx.AsyncClient`` each, their health, epoch,
models, and the requests in flight to each.

A replica is *up* while its ``/health`` answers 200 and its breaker is closed. A connection
error, a timeout or a 429/502/503 before the first byte opens the breaker for
``--replica-cooldown`` seconds; a health probe that answers closes it. A replica that comes back
after being down, or whose ``/health`` reports another start time (it restarted), gets a new
epoch in the route index, so the prefixes it held before stop counting; unless its ``/health``
says its cache survives (``"cache_persistent": true``, as ``kvproxy serve`` on Redis does).

The same probe lists each replica's models (``GET /v1/models``), which requests naming a model are
routed by, with the key ``probe_key`` picks. A replica that refuses it (401, 403) gets one warning,
until it lists them again, and is asked again only every ``REFUSED_RETRY_S``: the router then does
not know its models.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from proxy.http.auth import parse_api_keys
from store.breaker import CircuitBreaker

log = logging.getLogger("route")

PROBE_TIMEOUT_S = 2.0
REFUSED_RETRY_S = 60.0
"""Seconds before a replica that refused to list its models to the router is asked again."""


@dataclass
class Replica:
    """One upstream: ``url`` is its OpenAI base URL (``http://host:port/v1``), also its name in
    metrics and in the route index."""

    url: str
    client: httpx.AsyncClient
    breaker: CircuitBreaker
    up: bool = True
    probed: bool = False
    epoch: int = 0
    started: object = None  # what its /health last said about its start, when it says
    models: set[str] = field(default_factory=set)
    refused_at: float | None = None  # when it last refused GET /v1/models (401, 403; warned once)

    @property
    def root(self) -> str:
        """The server's root URL (``/health`` lives there, not under ``/v1``)."""
        return self.url.removesuffix("/v1")

    @property
    def available(self) -> bool:
        return self.up and self.breaker.allow()


def probe_key(api_keys: str | None) -> str | None:
    """The key the health probe lists each replica's models with, given the router's ``--api-keys``
    (its raw value): the first key listed (a file's first), which a replica started with the same
    ``--api-keys`` accepts; None without API keys, when a ``kvproxy serve`` replica started without
    them lists its models to anyone. Never ``--admin-key``: ``kvproxy serve`` takes it on its
    operator routes only, not on ``/v1``.

    Raises:
        ValueError, OSError: ``api_keys`` names no key, or a file that cannot be read.
    """
    keys = parse_api_keys(api_keys)
    return None if keys is None else next(iter(keys))


class Replicas:
    """Every replica, in the order given, plus this router's own in-flight counts.

    Args:
        urls: the replicas' OpenAI base URLs (``http://host:port/v1``), without credentials
            (``RouteSettings`` refuses them): each client's own key is what reaches a replica.
        connect_timeout_s: seconds to connect to a replica.
        cooldown_s: seconds a failed replica is skipped (its breaker's cooldown).
        probe_key: the key the probe lists models with (``probe_key()``), None to send none.
    """

    def __init__(
        self, urls: list[str], connect_timeout_s: float, cooldown_s: float, probe_key: str | None = None
    ) -> None:
        timeout = httpx.Timeout(None, connect=connect_timeout_s)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self.all = []
        for url in urls:
            client = httpx.AsyncClient(timeout=timeout, limits=limits)
            self.all.append(Replica(url, client, CircuitBreaker(cooldown_s)))
        self.inflight: Counter[str] = Counter()
        self.probe_key = probe_key

    def candidates(
        self, model: str | None, exclude: set[str] | frozenset[str] = frozenset()
    ) -> list[Replica]:
        """Replicas up and not excluded; of those, the ones listing ``model`` when any does (else
        all of them: the upstream answers for a model nobody lists)."""
        up = [r for r in self.all if r.available and r.url not in exclude]
        serving = [r for r in up if isinstance(model, str) and model in r.models]
        return serving or up

    def get(self, url: str) -> Replica:
        return next(r for r in self.all if r.url == url)

    def failed(self, replica: Replica, why: str) -> None:
        """A request to ``replica`` failed before its first byte: skip it for the cooldown."""
        if replica.breaker.failure():
            log.warning("replica %s failed (%s): skipped until it answers again", replica.url, why)

    async def probe(self, replica: Replica) -> tuple[bool, bool]:
        """Ask ``/health`` and ``/v1/models``; returns (up now, needs a new epoch)."""
        try:
            health = await replica.client.get(f"{replica.root}/health", timeout=PROBE_TIMEOUT_S)
            up = health.status_code == 200
        except httpx.HTTPError:
            up = False
        if not up:
            return False, False
        started, persistent = _started(health)
        restarted = (
            replica.probed
            and not persistent
            and (not replica.up or (started is not None and started != replica.started))
        )
        replica.started = started
        await self._list_models(replica)
        return True, restarted

    async def _list_models(self, replica: Replica) -> None:
        """``replica.models`` from its ``GET /v1/models``, asked with ``probe_key``; kept as they
        were when it does not answer 200 with a list of models."""
        headers = {} if self.probe_key is None else {"Authorization": f"Bearer {self.probe_key}"}
        if replica.refused_at is not None and time.monotonic() - replica.refused_at < REFUSED_RETRY_S:
            return  # NOTE: not a refused request in its log every probe
        try:
            listed = await replica.client.get(
                f"{replica.url}/models", headers=headers, timeout=PROBE_TIMEOUT_S
            )
        except httpx.HTTPError:
            return
        refused = listed.status_code in (401, 403)
        if refused and replica.refused_at is None:
            sent = "its first --api-keys key" if self.probe_key else "no key: the router has no --api-keys"
            log.warning(
                "replica %s refuses to list its models to the router (GET /v1/models: %d %s; sent %s), "
                "so the router does not know them: requests naming a model go to it only while no "
                "replica listing that model is up. Give the router the replicas' API keys "
                "(--api-keys, KVPROXY_API_KEYS).",
                replica.url,
                listed.status_code,
                listed.reason_phrase,
                sent,
            )
        replica.refused_at = time.monotonic() if refused else None
        if listed.status_code != 200:
            return
        try:
            replica.models = {m["id"] for m in listed.json().get("data", [])}
        except (ValueError, KeyError, TypeError, AttributeError):
            pass

    async def close(self) -> None:
        await asyncio.gather(*(r.client.aclose() for r in self.all))


def _started(response: httpx.Response) -> tuple[object, bool]:
    """The replica's start marker from its ``/health`` JSON (kvproxy: ``started``), if any, and
    whether it says its cache survives restarts (``cache_persistent``)."""
    try:
        doc = response.json()
    except ValueError:
        return None, False
    if not isinstance(doc, dict):
        return None, False
    return doc.get("started"), doc.get("cache_persistent") is True
