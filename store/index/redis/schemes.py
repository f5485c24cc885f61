"""The URL schemes of a Redis index (``store.index.redis.connect`` explains each form), apart
from the client so that choosing a backend by scheme loads no redis-py."""

from __future__ import annotations

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)
