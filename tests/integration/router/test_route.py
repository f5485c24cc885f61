"""``kvproxy route`` in front of three real ``kvproxy serve`` replicas on the tiny model, each with
its own cache (key prefix, blob directory, RAM tier): the hit rate routing buys, no hot spot, a
replica that stops and comes back, and two routers that agree."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from contextlib import ExitStack

import httpx
import pytest

from tests.helpers import ServerThread
from tests.replicas import cluster, replica_app, text


def ask(router, messages, max_tokens=8) -> httpx.Response:
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def converse(router, conversations: list[list[dict]], turns: int) -> tuple[int, int]:
    """Each conversation's turns, the conversations asked round-robin; (cached, prompt) tokens."""
    cached = prompt = 0
    for turn in range(turns):
        for n, messages in enumerate(conversations):
            messages.append(
                {"role": "user", "content": f"question {turn} of {n}: {text(1000 * n + turn, 12)}"}
            )
            usage = (r := ask(router, messages)).json()["usage"]
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
    return cached, prompt


def hit_rate(settings, tiny_model, tmp_path, policy: str, workload) -> float:
    with cluster(settings, tiny_model, tmp_path / policy, policy=policy) as ([router], _):
        cached, prompt = workload(router)
    return cached / prompt


def conversations(router) -> tuple[int, int]:
    """8 conversations x 3 turns, each under its own ~1,000-token system prompt."""
    convs = [[{"role": "system", "content": text(seed, 620)}] for seed in range(8)]
    return converse(router, convs, 3)


def documents(router) -> tuple[int, int]:
    """10 documents x 2 questions, in a seeded random order."""
    asks = [(doc, q) for doc in range(10) for q in range(2)]
    random.Random(7).shuffle(asks)
    cached = prompt = 0
    for doc, q in asks:
        messages = [{"role": "user", "content": f"{text(50 + doc, 620)}\n\nQuestion {q}: {text(q, 10)}"}]
        usage = ask(router, messages).json()["usage"]
        cached, prompt = (
            cached + usage["prompt_tokens_details"]["cached_tokens"],
            prompt + usage["prompt_tokens"],
        )
    return cached, prompt


def test_cache_aware_routing_keeps_conversations_on_their_replica(settings, tiny_model, tmp_path) -> None:
    """8 conversations x 3 turns: cache-aware reaches >= 1.8x round-robin's token hit rate and
    >= 90 % of one replica's; 10 documents x 2 questions: >= 1.5x round-robin's."""
    aware = hit_rate(settings, tiny_model, tmp_path, "cache-aware", conversations)
    robin = hit_rate(settings, tiny_model, tmp_path, "round-robin", conversations)
    with ExitStack() as stack:
        single = stack.enter_context(ServerThread(replica_app(settings, tiny_model, 9, tmp_path)))
        cached, prompt = conversations(single)
    print(
        f"conversations: cache-aware {aware:.3f}, round-robin {robin:.3f}, one replica {cached / prompt:.3f}"
    )
    assert aware >= 1.8 * robin and aware >= 0.9 * cached / prompt
    docs_aware = hit_rate(settings, tiny_model, tmp_path / "docs", "cache-aware", documents)
    docs_robin = hit_rate(settings, tiny_model, tmp_path / "docs", "round-robin", documents)
    print(f"documents: cache-aware {docs_aware:.3f}, round-robin {docs_robin:.3f}")
    assert docs_aware >= 1.5 * docs_robin


def test_a_shared_system_prompt_makes_no_hot_spot(settings, tiny_model, tmp_path) -> None:
    """8 concurrent clients, one shared system prompt: no replica gets over 75 % of requests."""
    system = {"role": "system", "content": text(3, 620)}
    sent: Counter[str] = Counter()
    lock = threading.Lock()
    with cluster(settings, tiny_model, tmp_path) as ([router], _):

        def client(n: int) -> None:
            messages = [system]
            for turn in range(3):
                messages.append(
                    {"role": "user", "content": f"client {n} turn {turn}: {text(n * 10 + turn, 15)}"}
                )
                r = ask(router, messages, max_tokens=16)
                messages.append(
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                )
                with lock:
                    sent[r.headers["x-kvproxy-replica"]] += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"requests per replica: {dict(sent)}")
    assert sum(sent.values()) == 24 and max(sent.values()) <= 0.75 * 24


def test_a_replica_stopped_mid_run_is_routed_around_and_back(settings, tiny_model, tmp_path) -> None:
    """Every request is answered 200 while a replica stops; it is marked down, and receives
    traffic again within 15 s of its restart."""
    with cluster(settings, tiny_model, tmp_path, policy="least-loaded") as ([router], replicas):
        victim = replicas[1]
        url = f"{victim.base_url}/v1"
        statuses, served_by = [], Counter()
        for i in range(12):
            if i == 4:
                victim.__exit__(None, None, None)
            r = ask(router, [{"role": "user", "content": text(i, 20)}])
            statuses.append(r.status_code)
            served_by[r.headers["x-kvproxy-replica"]] += i >= 4
        time.sleep(1.5)
        assert httpx.get(f"{router.base_url}/health").json()["replicas"][url] is False
        assert served_by[url] == 0
        restarted = ServerThread(replica_app(settings, tiny_model, 1, tmp_path), port=victim.port).__enter__()
        try:
            back_at, deadline = None, time.monotonic() + 15
            while back_at is None and time.monotonic() < deadline:
                r = ask(router, [{"role": "user", "content": text(99, 20)}])
                if r.headers["x-kvproxy-replica"] == url:
                    back_at = time.monotonic()
        finally:
            restarted.__exit__(None, None, None)
    assert statuses == [200] * 12
    assert back_at is not None


def test_two_routers_send_a_conversation_to_the_same_replica(settings, tiny_model, tmp_path) -> None:
    """Turn 1 through one router, turns 2 and 3 through another (both hashing text, no
    tokenizer): the same replica, each a hit."""
    with cluster(settings, tiny_model, tmp_path, routers=2, hashing="text") as (routers, _):
        messages = [{"role": "system", "content": text(11, 620)}]
        seen = []
        for turn, router in enumerate([routers[0], routers[1], routers[1]]):
            messages.append({"role": "user", "content": f"turn {turn}"})
            r = ask(router, messages)
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            seen.append((r.headers["x-kvproxy-replica"], r.headers["x-kvproxy-route"]))
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len({replica for replica, _ in seen}) == 1
    assert [decision for _, decision in seen[1:]] == ["affinity", "affinity"] and cached > 0


def test_the_route_index_is_scoped_by_the_key_the_router_forwards(settings, tiny_model, tmp_path) -> None:
    """A router without keys in front of keyed replicas: tenant B's traffic never makes tenant A's
    request an affinity decision (nor shows in its headers); A's own second turn is one."""
    keyed = settings.model_copy(update={"api_keys": "key-a=A,key-b=B"})
    with cluster(keyed, tiny_model, tmp_path) as ([router], _):
        messages = [{"role": "user", "content": text(77, 700)}]

        def as_tenant(key: str) -> str:
            body = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}
            headers = {"Authorization": f"Bearer {key}"}
            r = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
            assert r.status_code == 200, r.text
            return r.headers["x-kvproxy-route"]

        for _ in range(3):
            assert as_tenant("key-b") in ("affinity", "fallback")
        time.sleep(0.5)  # NOTE: the route index records in the background
        assert as_tenant("key-a") != "affinity"
        time.sleep(0.5)
        assert as_tenant("key-a") == "affinity"


def test_a_client_that_leaves_a_whole_answer_stops_the_replica(settings, tiny_model, tmp_path) -> None:
    """Not streamed: the client gives up after half a second; the replica's generation is
    cancelled (it would have run to 4,000 tokens), as it is for a client of its own."""
    with cluster(settings, tiny_model, tmp_path, policy="round-robin") as ([router], replicas):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{router.base_url}/v1/chat/completions", json=body | {"temperature": 0}, timeout=0.5)
        deadline = time.monotonic() + 30

        def finished(reason: str) -> float:
            found = 0.0
            for replica in replicas:
                text_ = httpx.get(f"{replica.base_url}/metrics").text
                pattern = rf'^vllm:request_success_total{{[^}}]*finished_reason="{reason}"[^}}]*}} (\S+)'
                found += sum(float(v) for v in re.findall(pattern, text_, re.M))
            return found

        while finished("cancelled") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert finished("cancelled") == 1 and finished("length") == 0


def keyed_users(router, keyed: bool) -> tuple[int, int, dict[int, set[str]]]:
    """8 users x 3 requests, asked round-robin, each user's requests under a system prompt of its
    own shorter than a block (nothing for block matching to route on), with ``prompt_cache_key``
    ``user-N`` or without; (cached, prompt) tokens, and the replicas each user's requests went to."""
    cached = prompt = 0
    replicas: dict[int, set[str]] = {user: set() for user in range(8)}
    for turn in range(3):
        for user in range(8):
            body = {
                "model": "tiny",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": text(300 + user, 50)},
                    {"role": "user", "content": f"question {turn}: {text(user * 10 + turn, 4)}"},
                ],
            } | ({"prompt_cache_key": f"user-{user}"} if keyed else {})
            r = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
            replicas[user].add(r.headers["x-kvproxy-replica"])
    return cached, prompt, replicas


def test_prompt_cache_key_keeps_a_users_requests_on_one_replica(settings, tiny_model, tmp_path) -> None:
    """With ``prompt_cache_key``, every user's 3 requests go to one replica, and their short
    system prompts are read from the cache there; without keys the same run scatters them."""
    rates = {}
    for keyed in (True, False):
        with cluster(settings, tiny_model, tmp_path / str(keyed)) as ([router], _):
            cached, prompt, replicas = keyed_users(router, keyed)
        rates[keyed] = cached / prompt
        if keyed:
            assert all(len(used) == 1 for used in replicas.values()), replicas
            assert len(set().union(*replicas.values())) > 1  # the load still spreads users
    print(f"prompt_cache_key: hit rate {rates[True]:.3f} with keys, {rates[False]:.3f} without")
    assert rates[True] >= 1.5 * rates[False]
