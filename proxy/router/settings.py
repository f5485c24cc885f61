"""Settings of ``kvproxy route`` (``docs/router.md``): ``ServerSettings`` plus the replicas and the
routing policy. Environment variables: ``KVPROXY_<FIELD>``; CLI flags: ``--<field>``.

NOTE: the shared settings whose ``serve`` description is untrue of the router (it loads no model,
stores no blocks and serves no ``/v1/cache/*``) are declared again here, with the same default and
bounds and the router's own description (``tests/unit/proxy/router/test_route_settings.py`` holds
to that)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import httpx
from pydantic import Field, field_validator

from proxy.config import ServerSettings, default_cache_dir
from proxy.router.policy import Policy
from store.index.embedded.files import EMBEDDED_URL
from store.index.redis.connect import redact_url


class RouteSettings(ServerSettings):
    """Everything ``kvproxy route`` can be told (``docs/router.md`` explains each)."""

    command: ClassVar[str] = "kvproxy route"

    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where a model --tokenizer names (a known model, a .gguf file) is fetched and "
        "converted; the router reads only its tokenizer.",
    )
    redis_url: str = Field(
        EMBEDDED_URL,
        description="Redis holding the route index the routers share (which replica was sent which "
        "prompt blocks, the loads, where responses are): redis://, rediss:// (TLS), unix://, "
        "redis+cluster://HOST:PORT[,HOST:PORT...] or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB] "
        "(Redis >= 7); default embedded://: kvproxy's own Valkey in CACHE_DIR/index, shared by the host's "
        "kvproxy processes; memory://: none, this router routes on its own in-flight counts (not by prefix).",
    )
    key_prefix: str = Field(
        "kvp:",
        description="Prefix of every Redis key the router writes; routers on one Redis and prefix share "
        "their route index.",
    )
    admin_key: str | None = Field(
        None,
        description="Bearer key of the operator: once any key is set (this or --api-keys), /metrics and "
        "/stats need it; the key itself or a file holding it.",
    )
    api_keys: str | None = Field(
        None,
        description="Require Bearer keys on /v1 and /v1beta: comma-separated `key` or `key=tenant`, or a "
        "file of one per line; keys naming the same tenant share routes, others never do. Give the "
        "replicas' keys: a client's key is passed on to them, and the first key lists their models.",
    )
    redis_retry: float = Field(
        5.0,
        gt=0,
        description="Seconds to route on this router's own counts after a Redis failure before trying "
        "Redis again.",
    )
    upstream: str = Field(
        ...,
        min_length=1,
        description="OpenAI base URLs of the replicas, comma-separated (http://host:port/v1), without "
        "user:password (refused): each client's own key is what reaches the replicas.",
    )
    tokenizer: str | None = Field(
        None,
        description="Known model name or checkpoint directory whose tokenizer and chat template render "
        "prompts to token ids as the replicas do (default: hash the prompt's text).",
    )
    chat_template: Path | None = Field(
        None,
        description="A Jinja chat template file that replaces --tokenizer's own, as the replicas' "
        "--chat-template does (give them the same file).",
    )
    policy: Policy = Field("cache-aware", description="How a replica is chosen.")
    route_ttl: int = Field(
        600, gt=0, description="Seconds a replica is assumed to keep a prompt's blocks after its last use."
    )
    route_min_match_tokens: int = Field(
        128, ge=0, description="Shortest cached prefix (tokens) worth routing for."
    )
    route_min_match_fraction: float = Field(
        0.5, ge=0, le=1, description="Share of the prompt a cached prefix must cover to be routed for."
    )
    balance_abs_threshold: int = Field(
        2, ge=0, description="In-flight difference between replicas beyond which load wins over prefix."
    )
    balance_rel_threshold: float = Field(
        1.5, ge=1, description="...and the ratio of most to least loaded beyond which load wins."
    )
    health_interval: float = Field(2.0, gt=0, description="Seconds between health probes of each replica.")
    connect_timeout: float = Field(2.0, gt=0, description="Seconds to connect to a replica.")
    first_byte_timeout: float = Field(
        300.0, gt=0, description="Seconds a replica may take to start answering; then retried elsewhere."
    )
    replica_cooldown: float = Field(
        5.0, gt=0, description="Seconds a failed replica is skipped unless its health probe answers."
    )

    @field_validator("upstream")
    @classmethod
    def _base_urls(cls, upstream: str) -> str:
        urls = [u.strip().rstrip("/") for u in upstream.split(",") if u.strip()]
        if not urls:
            raise ValueError("give at least one replica's OpenAI base URL (http://host:port/v1)")
        for url in urls:
            if not re.fullmatch(r"https?://[^/\s]+(/\S*)?/v1", url) or not _parses(url):
                raise ValueError(
                    f"{redact_url(url)!r} is not an OpenAI base URL: http(s)://host:port[/path]/v1"
                )
            if httpx.URL(url).userinfo:
                # NOTE: the router has no credential of its own to send: a replica's one
                # Authorization header carries the client's key, which a URL's Basic auth would
                # replace, making every client one tenant there
                raise ValueError(
                    f"{redact_url(url)!r} carries a user or password, which the router never sends: "
                    "each client's own key reaches the replicas unchanged. Remove it; keep the "
                    "replicas on a network only the router reaches, or start them with --api-keys"
                )
        return upstream

    @property
    def upstreams(self) -> list[str]:
        """The replicas' base URLs, without a trailing slash, in the order given."""
        return [u.strip().rstrip("/") for u in self.upstream.split(",") if u.strip()]


def _parses(url: str) -> bool:
    """Whether ``url``'s host and port parse: a host (an IPv6 one in brackets that close), a port
    from 1 to 65535 when one is given, no query or fragment."""
    try:
        parts = urlsplit(url)
        return bool(httpx.URL(url).host) and parts.port != 0 and not parts.fragment and not parts.query
    except (httpx.InvalidURL, ValueError):
        return False
