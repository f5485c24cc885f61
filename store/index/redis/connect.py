"""Redis clients from ``--redis-url``: one server, a Redis Cluster, or a master found by Sentinel.

URL forms (the scheme picks redis-py's client; options are redis-py's own argument names):

    redis://[[user]:password@]host:port[/db]       one server (also ``rediss://`` for TLS,
    unix:///path/to/socket[?db=N]                   ``unix://``), ``redis.Redis.from_url``
    redis+cluster://[[user]:password@]host:port[,host:port...][/?ssl=true&...]
                                                    ``redis.cluster.RedisCluster`` on those
                                                    startup nodes (``rediss+cluster://``: TLS)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/SERVICE[/DB][?...]
                                                    ``redis.sentinel.Sentinel(...).master_for``
                                                    (``rediss+sentinel://``: TLS to the master)

Query options: ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname``; for Sentinel also ``sentinel_username`` and ``sentinel_password`` (the
sentinels' own credentials, when they differ from the master's). The password in the URL is the
data nodes' (the master's, under Sentinel).

Every client fails an operation within ``timeout_s`` and never retries (a slow Redis is a cache
miss at once; the caller's circuit breaker takes it from there). Redis >= 7.0 is required
(``EXPIRE ... GT`` in the index's scripts).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.connection import Encoder
from redis.exceptions import NoScriptError, RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from store.index.redis.schemes import CLUSTER_SCHEMES, SCHEMES, SENTINEL_SCHEMES

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a Redis operation may raise on a fault: redis-py's cluster client raises some errors
(a slot no node covers, a cluster it cannot reach) outside ``redis.RedisError``."""

_BOOL_OPTIONS = {"ssl", "ssl_check_hostname"}
_TEXT_OPTIONS = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "username", "password"}
_SENTINEL_OPTIONS = {"sentinel_username", "sentinel_password"}


_SECRET = re.compile(r"(?i)password|secret|token|passwd|pwd")


def redact_url(url: str) -> str:
    """``url`` as logs and messages may show it: the password of its user info (all of a user
    info without one: a token, or a password percent-encoded), and the value of any query option
    naming a password, secret or token (its name percent-decoded first), replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:  # NOTE: a user without a password may be a token (``https://TOKEN@host``, ``TOKEN:@``)
        user, _, password = userinfo.partition(":")
        netloc = f"{user}:***@{hosts}" if password and ":" not in unquote(user) else f"***@{hosts}"
    if "?" in netloc and not slash:  # a query right after the host: ``redis://h:1?password=x``
        netloc, _, query = netloc.partition("?")
        tail = "?" + query
    path, question, query = tail.partition("?")
    options = [
        f"{name}={'***' if _SECRET.search(unquote(name)) else value}" if eq else name
        for name, eq, value in (part.partition("=") for part in query.split("&"))
    ]
    return f"{scheme}://{netloc}{slash}{path}{question}{'&'.join(options) if question else ''}"


class RedisURLError(ValueError):
    """A ``--redis-url`` that cannot be used; the message names what is wrong."""


def redis_client(url: str, timeout_s: float) -> redis.Redis:
    """A client for ``url`` whose every operation fails within ``timeout_s`` seconds, unretried.

    Returns a ``redis.Redis`` (also for Sentinel: a client of the current master that finds the
    new one after a failover) or a ``RedisCluster`` (typed as ``redis.Redis``: the index uses the
    commands both have).

    Raises:
        RedisURLError: an unknown scheme, a missing host, port, service name or a bad option.
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        nodes, _, options = _parse(url, tls=scheme.startswith("rediss"))
        return LazyCluster(nodes, common | options)  # type: ignore[return-value]
    if scheme in SENTINEL_SCHEMES:
        nodes, path, options = _parse(url, tls=scheme.startswith("rediss"))
        service, db = _service(path)
        sentinel_options = {k: options.pop(k) for k in list(options) if k in _SENTINEL_OPTIONS}
        sentinel_kwargs = {k.removeprefix("sentinel_"): v for k, v in sentinel_options.items()}
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            nodes,
            sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
            | sentinel_kwargs,
            **common,
        )
        master: redis.Redis = sentinel.master_for(service, db=db, **options)  # type: ignore[no-untyped-call]
        return master
    if scheme in SCHEMES:
        return redis.Redis.from_url(url, **common)
    raise RedisURLError(
        f"{redact_url(url)!r}: the scheme must be redis://, rediss://, unix://, redis+cluster:// or "
        "redis+sentinel://"
    )


def check_url(url: str) -> None:
    """Raises ``RedisURLError`` for a cluster or sentinel URL that cannot work (no host:port, no
    service name, an unknown option), without connecting."""
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        _, path, _ = _parse(url, tls=False)
        if scheme in SENTINEL_SCHEMES:
            _service(path)


class LazyCluster:
    """A ``RedisCluster`` made on first use, and again after a failed attempt: redis-py's cluster
    client connects as it is made, and an unreachable cluster at start must be a cache miss (the
    caller's breaker), not a server that cannot start. Scripts register without connecting."""

    def __init__(self, nodes: list[tuple[str, int]], options: dict[str, Any]) -> None:
        self._nodes, self._options = nodes, options
        self._client: RedisCluster | None = None

    def _real(self) -> RedisCluster:
        if self._client is None:
            startup = [ClusterNode(host, port) for host, port in self._nodes]  # type: ignore[no-untyped-call]
            self._client = RedisCluster(startup_nodes=startup, **self._options)
        return self._client

    def get_encoder(self) -> Encoder:
        """The encoder ``Script`` hashes a script's text with (redis-py's default)."""
        return Encoder("utf-8", "strict", False)  # type: ignore[no-untyped-call]

    def register_script(self, script: str) -> Script:
        return NodeScript(self, script)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)


class NodeScript(Script):
    """A Lua script on a Cluster: by its SHA, and where the node holding its keys lacks it, by its
    text there (``EVAL`` goes only to that node). redis-py's own ``Script`` would send
    ``SCRIPT LOAD`` to every primary, which fails while any one is down: a script first used
    after a node went away would then fail on the nodes still up."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        keys, args, client = list(keys or []), list(args or []), client or self.registered_client
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.script, len(keys), *keys, *args)


def _parse(url: str, *, tls: bool) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """``(nodes, path, options)`` of a cluster or sentinel URL."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    options: dict[str, Any] = {"ssl": True} if tls else {}
    if userinfo:
        user, _, password = userinfo.partition(":")
        options |= {"username": unquote(user) or None, "password": unquote(password) or None}
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise RedisURLError(f"{redact_url(url)!r}: {item.rpartition('@')[2]!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _BOOL_OPTIONS:
            options[name] = value.lower() in ("1", "true", "yes", "on")
        elif name in _TEXT_OPTIONS | _SENTINEL_OPTIONS:
            options[name] = value
        else:
            raise RedisURLError(f"{redact_url(url)!r}: unknown option {name!r}")
    return nodes, parts.path, {k: v for k, v in options.items() if v is not None}


def _service(path: str) -> tuple[str, int]:
    """``(service name, db)`` from a sentinel URL's path ``/SERVICE[/DB]``."""
    pieces = [p for p in path.split("/") if p]
    if not pieces or len(pieces) > 2 or (len(pieces) == 2 and not pieces[1].isdigit()):
        raise RedisURLError("a redis+sentinel:// URL needs /SERVICE_NAME[/DB] after the hosts")
    return pieces[0], int(pieces[1]) if len(pieces) == 2 else 0
