"""The router's own memory of where responses and cache keys are (while Redis is off): a tenant
holds at most ``TENANT_LOCAL`` of its ``LOCAL_RESPONSES``, and a ``prompt_cache_key`` is kept as
its digest."""

from __future__ import annotations

import asyncio

from proxy.router.identity import Identity
from proxy.router.routing import LOCAL_RESPONSES, TENANT_LOCAL, Router
from proxy.router.settings import RouteSettings


def test_one_tenant_never_evicts_anothers_routes_and_keys_are_digests() -> None:
    """Tenant a remembers more keys than its share: b's one is kept, a's newest too, a's oldest
    went; a 100 kB key is kept as 32 hex digits."""
    router = Router(
        RouteSettings(upstream="http://127.0.0.1:9/v1", redis_url="memory://"), None, Identity(None)
    )
    replica = router.replicas.all[0]

    async def run() -> None:
        await router.remember_key("b", "b" * 100_000, replica)
        for i in range(TENANT_LOCAL + 10):
            await router.remember_key("a", f"key-{i}", replica)
        assert await router.key_replica("b", "b" * 100_000) == replica.url
        assert await router.key_replica("a", f"key-{TENANT_LOCAL + 9}") == replica.url
        assert await router.key_replica("a", "key-0") is None
        await router.replicas.close()

    asyncio.run(run())
    assert len(router.responses) == TENANT_LOCAL + 1 <= LOCAL_RESPONSES
    assert max(len(i) for _, i in router.responses) == len("prompt_cache_key:") + 32
