"""The lookup stage runs off the model thread: a request whose blob read hangs (a stuck disk or
network mount) holds up only itself, and is answered as a miss once the read's bound passes."""

from __future__ import annotations

import threading

import httpx

from tests.api import Api
from tests.helpers import random_tokens


def test_a_hanging_blob_read_holds_up_only_its_own_request(settings, tiny_model, serve, cold) -> None:
    """While A's blob read hangs, B (already streaming) keeps getting tokens, one per decode step;
    A is answered as a miss ("read timed out") while its read is still stuck, like cold."""
    settings = settings.model_copy(update={"ram_cache_bytes": 0, "cache_read_timeout": 2.0})
    a_prompt = random_tokens(300, seed=501)
    with serve(settings, tiny_model) as server:
        api, url = Api(server), f"{server.base_url}/v1/completions"
        # 1. A's two blocks are stored.
        api.complete(a_prompt)
        api.flush()

        # 2. From now on every blob read hangs until released (a stuck mount).
        blobs = server.app.state.engine.cache.parts.blobs
        read = blobs.read
        hanging, release, returned = threading.Event(), threading.Event(), threading.Event()

        def stuck_read(namespace, block_hash, *bound):
            hanging.set()
            release.wait(120)
            returned.set()
            return read(namespace, block_hash, *bound)

        blobs.read = stuck_read

        # 3. B streams a long completion (EOS banned).
        eos = str(tiny_model.tokenizer.eos_token_id)
        b_body = {
            "model": "tiny",
            "prompt": random_tokens(50, seed=502),
            "max_tokens": 3000,
            "stream": True,
            "temperature": 0,
            "logit_bias": {eos: -100},
        }
        b_tokens: list[str] = []
        b_started, stop_b = threading.Event(), threading.Event()

        def stream_b() -> None:
            with httpx.stream("POST", url, json=b_body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        b_tokens.append(line)
                        if len(b_tokens) >= 5:
                            b_started.set()
                    if stop_b.is_set():
                        return

        b = threading.Thread(target=stream_b)
        b.start()
        assert b_started.wait(60)

        # 4. A is sent; its lookup hangs in the blob read.
        a_answer: list[httpx.Response] = []
        headers = {"x-kvproxy-explain": "1"}
        a_body = {
            "model": "tiny",
            "prompt": a_prompt,
            "max_tokens": 8,
            "temperature": 0,
            "return_token_ids": True,
        }
        a = threading.Thread(
            target=lambda: a_answer.append(httpx.post(url, json=a_body, headers=headers, timeout=120))
        )
        a.start()
        assert hanging.wait(60)
        b_at_hang, steps_at_hang = len(b_tokens), server.app.state.engine.stats().decode_steps
        a.join(120)
        b_at_answer, steps_at_answer = len(b_tokens), server.app.state.engine.stats().decode_steps
        read_still_stuck = not returned.is_set()
        release.set()
        stop_b.set()
        b.join(60)

    # 5. A was answered while its read was still stuck: a miss, for the reason, like cold.
    assert read_still_stuck
    response = a_answer[0]
    assert response.status_code == 200
    explanation = response.json()["kvproxy_cache_explanation"]
    assert (explanation["cached_tokens"], explanation["reason"]) == (0, "read timed out")
    assert response.json()["choices"][0]["token_ids"] == cold.complete(a_prompt).token_ids
    # 6. Meanwhile B kept decoding: a token per decode step, never waiting on A's read.
    assert b_at_answer - b_at_hang >= 20 and steps_at_answer - steps_at_hang >= 20
