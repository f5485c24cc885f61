"""kvproxy under Redis Sentinel: the master is SIGKILLed during a steady stream of requests;
every request is answered 200 (misses allowed) and hits resume on the promoted replica by
themselves. The lifecycle and store suites also run under Sentinel (``TOPOLOGIES``)."""

from __future__ import annotations

import threading
import time

from proxy.app import create_app
from tests.api import Api
from tests.helpers import HANG_S, ServerThread, random_tokens, wait_for
from tests.topologies import LocalSentinel

PROMPT = random_tokens(300, seed=81)  # two full blocks and a tail
HIT = len(PROMPT) - 1


def test_a_failover_answers_every_request_and_caching_resumes(settings, tiny_model) -> None:
    """The master dies under a stream of hits: every request is answered 200, and hits resume on
    the promoted replica by themselves."""
    sentinel = LocalSentinel().start()
    results: list[tuple[float, int, int]] = []  # (time, status, cached tokens)
    stop = threading.Event()
    try:
        on_sentinel = settings.model_copy(update={"redis_url": sentinel.url, "redis_retry": 0.5})
        with ServerThread(create_app(on_sentinel, tiny_model)) as server:
            api = Api(server)
            api.complete(PROMPT)
            api.flush()

            def steady() -> None:
                while not stop.is_set():
                    r = api.complete(PROMPT, max_tokens=2)
                    results.append((time.monotonic(), r.status, r.cached_tokens))

            client = threading.Thread(target=steady)
            client.start()
            try:
                # NOTE: the stream is hitting before the master dies (however slow its requests)
                wait_for(lambda: any(cached == HIT for _, _, cached in results), what="a hit before")
                old = sentinel.master()
                sentinel.kill(old)
                killed = time.monotonic()
                wait_for(lambda: sentinel.master() != old, what="the replica's promotion")
                promoted = time.monotonic()
                wait_for(
                    lambda: [t for t, _, cached in results if t > promoted + 0.5 and cached == HIT],
                    what="a hit after the promotion",
                )
            finally:
                stop.set()
                client.join(HANG_S)
    finally:
        sentinel.stop()
    assert [status for _, status, _ in results if status != 200] == []
    assert any(t < killed and cached == HIT for t, _, cached in results)
