"""Bad input gets a clear OpenAI-shaped error with the right status, and changes nothing."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from tests.helpers import HANG_S, random_tokens, wait_for

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
LONG = random_tokens(300, seed=9)  # a prompt long enough to store blocks, were it accepted

# (name, path, body (dict, or raw bytes), expected status, expected param or None, expected code or None)
CASES = [
    ("malformed JSON", CHAT, b'{"model": "tiny", "messages": [', 400, None, None),
    ("body is not an object", CHAT, b"[1, 2, 3]", 400, None, None),
    ("missing messages", CHAT, {"model": "tiny"}, 400, "messages", None),
    ("empty messages", CHAT, {"model": "tiny", "messages": []}, 400, "messages", None),
    ("messages wrong type", CHAT, {"model": "tiny", "messages": "hi"}, 400, "messages", None),
    (
        "unknown role",
        CHAT,
        {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
        None,
    ),
    (
        "content wrong type",
        CHAT,
        {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
        400,
        None,
        None,
    ),
    ("max_tokens zero", CHAT, {"model": "tiny", "messages": USER, "max_tokens": 0}, 400, "max_tokens", None),
    (
        "max_tokens negative",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "max_tokens": -3},
        400,
        "max_tokens",
        None,
    ),
    (
        "max_tokens string",
        CHAT,
        {"model": "tiny", "messages": USER, "max_tokens": "many"},
        400,
        "max_tokens",
        None,
    ),
    (
        "temperature out of range",
        CHAT,
        {"model": "tiny", "messages": USER, "temperature": 7},
        400,
        "temperature",
        None,
    ),
    ("top_p zero", CHAT, {"model": "tiny", "messages": USER, "top_p": 0}, 400, "top_p", None),
    ("n = 2", CHAT, {"model": "tiny", "messages": USER, "n": 2}, 400, "n", "unsupported_parameter"),
    (
        "a tool that is not a function",
        CHAT,
        {"model": "tiny", "messages": USER, "tools": [{"type": "code_interpreter"}]},
        400,
        "tools[0].type",
        None,
    ),
    (
        "legacy functions",
        CHAT,
        {"model": "tiny", "messages": USER, "functions": [{"name": "f"}]},
        400,
        "functions",
        "unsupported_parameter",
    ),
    (
        "an unknown answer format",
        CHAT,
        {"model": "tiny", "messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format.type",
        None,
    ),
    (
        "image part",
        CHAT,
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ],
        },
        400,
        "messages[0].content",
        "unsupported_parameter",
    ),
    (
        "audio output",
        CHAT,
        {"model": "tiny", "messages": USER, "modalities": ["text", "audio"]},
        400,
        "modalities",
        "unsupported_parameter",
    ),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": USER}, 404, "model", "model_not_found"),
    ("negative token id", COMPLETIONS, {"model": "tiny", "prompt": [*LONG, -1]}, 400, "prompt", None),
    ("token id past vocab", COMPLETIONS, {"model": "tiny", "prompt": [*LONG, 10**9]}, 400, "prompt", None),
    ("empty prompt", COMPLETIONS, {"model": "tiny", "prompt": []}, 400, "prompt", None),
    ("prompt wrong type", COMPLETIONS, {"model": "tiny", "prompt": {"a": 1}}, 400, "prompt", None),
    (
        "suffix",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "suffix": "x"},
        400,
        "suffix",
        "unsupported_parameter",
    ),
    (
        "best_of 2",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "best_of": 2},
        400,
        "best_of",
        "unsupported_parameter",
    ),
    (
        "echo with logprobs",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "echo": True, "logprobs": 1},
        400,
        "echo",
        "unsupported_parameter",
    ),
    (
        "over the context",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "max_tokens": 5000},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "huge max_tokens",
        CHAT,
        {"model": "tiny", "messages": USER, "max_tokens": 10**12},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "bad retention",
        COMPLETIONS,
        {"model": "tiny", "prompt": LONG, "prompt_cache_retention": "1y"},
        400,
        "prompt_cache_retention",
        None,
    ),
    (
        "too many stop strings",
        CHAT,
        {"model": "tiny", "messages": USER, "stop": ["a", "b", "c", "d", "e"]},
        400,
        "stop",
        None,
    ),
    ("stream as a string", CHAT, {"model": "tiny", "messages": USER, "stream": "yes"}, 400, "stream", None),
    (
        "max_tokens as a string",
        CHAT,
        {"model": "tiny", "messages": USER, "max_tokens": "5"},
        400,
        "max_tokens",
        None,
    ),
    (
        "max_tokens as a bool",
        CHAT,
        {"model": "tiny", "messages": USER, "max_tokens": True},
        400,
        "max_tokens",
        None,
    ),
    (
        "temperature NaN",
        CHAT,
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        "temperature",
        None,
    ),
    (
        "logit_bias not a token",
        CHAT,
        {"model": "tiny", "messages": USER, "logit_bias": {"abc": 5}},
        400,
        "logit_bias",
        None,
    ),
    (
        "logit_bias out of range",
        CHAT,
        {"model": "tiny", "messages": USER, "logit_bias": {"5": 500}},
        400,
        None,
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "param", "code"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_is_rejected_cleanly(
    cached, settings, redis_client, key_prefix, name, path, body, status, param, code
):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{cached.server.base_url}{path}", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    cached.flush()
    assert not list(redis_client.scan_iter(match=f"{key_prefix}*:b:*"))
    assert not settings.blob_root.exists() or not list(settings.blob_root.rglob("*.safetensors"))


def test_body_over_the_limit_is_413(settings, tiny_model, serve):
    """Declared or streamed (chunked), a body over --max-body-bytes is refused before parsing."""
    with serve(settings.model_copy(update={"max_body_bytes": 2000}), tiny_model) as server:
        url = f"{server.base_url}{COMPLETIONS}"
        declared = httpx.post(url, json={"model": "tiny", "prompt": "x" * 5000})

        def chunks():
            yield b'{"model": "tiny", "prompt": "'
            for _ in range(20):
                yield b"x" * 200
            yield b'"}'

        streamed = httpx.post(url, content=chunks(), headers={"content-type": "application/json"})
    for r in (declared, streamed):
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_full_queue_answers_503_with_retry_after(settings, default_model, serve):
    """--max-queue 1, --max-batch 1: while one long prefill runs and one request waits, the next is
    told to retry."""
    with serve(settings.model_copy(update={"max_queue": 1, "max_batch": 1}), default_model) as server:
        url = f"{server.base_url}{COMPLETIONS}"
        body = {"model": default_model.name, "prompt": random_tokens(2000, seed=1), "max_tokens": 1}
        engine = server.app.state.engine
        send = lambda: httpx.post(url, json=body, timeout=HANG_S)  # noqa: E731
        running = threading.Thread(target=send)
        running.start()
        wait_for(lambda: not engine.idle and engine.queue_depth == 0, what="the first to run")
        waiting = threading.Thread(target=send)
        waiting.start()
        wait_for(lambda: engine.queue_depth == 1, what="the second to wait")
        r = httpx.post(url, json=body, timeout=HANG_S)
        running.join()
        waiting.join()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "server_error"


def test_a_waiting_client_that_leaves_frees_its_place(settings, default_model, serve):
    """--max-queue 1, --max-batch 1: B waits behind a long prefill and gives up; C then gets the
    place, not a 503."""
    with serve(settings.model_copy(update={"max_queue": 1, "max_batch": 1}), default_model) as server:
        url = f"{server.base_url}{COMPLETIONS}"
        long = {"model": default_model.name, "prompt": random_tokens(2000, seed=2), "max_tokens": 1}
        engine = server.app.state.engine
        running = threading.Thread(target=lambda: httpx.post(url, json=long, timeout=HANG_S))
        running.start()
        wait_for(lambda: not engine.idle and engine.queue_depth == 0, what="A to run")
        payload = json.dumps(long).encode()
        head = f"POST {COMPLETIONS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with socket.create_connection(("127.0.0.1", server.port)) as b:  # B: gives up while waiting
            b.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            wait_for(lambda: engine.queue_depth == 1, what="B to wait")
        wait_for(lambda: engine.queue_depth == 0, what="B's leaving to be noticed")
        c = httpx.post(url, json=long | {"prompt": random_tokens(50, seed=3)}, timeout=HANG_S)
        running.join()
    assert c.status_code == 200
