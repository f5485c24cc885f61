"""Deployment-wide counters in Redis, so several proxy processes add up.

Keys (under ``key_prefix``): ``stats`` holds the deployment's totals (tokens queried and hit,
blocks saved and evicted, ...) and ``tok:all:{t}`` the tokens queried (``q``) and hit (``h``)
during the 10-second bucket ``t`` (Unix time // 10), for one hour; a namespace's are
``{ns}:stats`` and ``{ns}:tok:{t}``, hash-tagged like its blocks (``store.index.redis.keys``), so they live
on its node of a Redis Cluster. Windows and timelines are sums of buckets: one round trip each.
"""

from __future__ import annotations

import time

import redis

from store.index.base import BUCKET_S, KEEP_S, Window


class SharedCounters:
    """Totals and hit-rate windows, for the whole deployment or one namespace (tenant)."""

    def __init__(self, client: redis.Redis, key_prefix: str) -> None:
        self.client, self.key_prefix = client, key_prefix

    def _totals_key(self, scope: str | None) -> str:
        return f"{self.key_prefix}{{{scope}}}:stats" if scope else f"{self.key_prefix}stats"

    def _bucket_key(self, scope: str | None, bucket: int) -> str:
        return f"{self.key_prefix}{{{scope}}}:tok:{bucket}" if scope else f"{self.key_prefix}tok:all:{bucket}"

    def add(self, namespace_hex: str | None, counts: dict[str, int]) -> None:
        """Add ``counts`` to the totals of the deployment and of ``namespace_hex``; the
        ``prompt_tokens``/``cached_tokens`` counts also go to the current bucket.

        Raises:
            redis.RedisError: Redis failed.
        """
        bucket = int(time.time()) // BUCKET_S
        pipe = self.client.pipeline(transaction=False)
        for scope in (None, namespace_hex) if namespace_hex else (None,):
            for name, delta in counts.items():
                if delta:
                    pipe.hincrby(self._totals_key(scope), name, delta)
            if counts.get("prompt_tokens"):
                key = self._bucket_key(scope, bucket)
                pipe.hincrby(key, "q", counts["prompt_tokens"])
                pipe.hincrby(key, "h", counts.get("cached_tokens", 0))
                pipe.expire(key, KEEP_S)
        pipe.execute()

    def totals(self, scope: str | None = None) -> dict[str, int]:
        """Totals of the deployment (``scope`` None) or of one namespace."""
        raw: dict[bytes, bytes] = self.client.hgetall(self._totals_key(scope))  # type: ignore[assignment]
        return {k.decode(): int(v) for k, v in raw.items()}

    def buckets(self, scope: str | None, seconds: int) -> list[tuple[int, Window]]:
        """``(bucket start, Unix seconds; window)`` for every bucket of the last ``seconds``."""
        now = int(time.time()) // BUCKET_S
        starts = list(range(now - seconds // BUCKET_S + 1, now + 1))
        pipe = self.client.pipeline(transaction=False)
        for b in starts:
            pipe.hmget(self._bucket_key(scope, b), "q", "h")
        return [
            (b * BUCKET_S, Window(int(q or 0), int(h or 0)))
            for b, (q, h) in zip(starts, pipe.execute(), strict=True)
        ]

    def window(self, scope: str | None, seconds: int) -> Window:
        """Tokens queried and hit during the last ``seconds`` (to 10-second buckets)."""
        windows = [w for _, w in self.buckets(scope, seconds)]
        return Window(sum(w.queried for w in windows), sum(w.hit for w in windows))
