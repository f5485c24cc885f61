"""Batching: concurrent requests decode together in one forward pass and answer as they would
alone; a short request is never stuck behind another's whole generation."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from engine.buffers import BufferPool
from engine.forward import decode_batch, decode_step, prefill
from engine.kv import past_from_blocks
from engine.worker import Engine
from tests.helpers import random_tokens, wait_for


def test_a_batched_decode_step_equals_each_row_alone(tiny_model) -> None:
    """Rows of different lengths, each in a buffer holding just its prompt (so the step grows
    them all): logits within 1e-5 of the same token fed to each row alone."""
    engine = Engine(tiny_model, None)
    model = tiny_model.model
    exact = BufferPool(engine.buffers.like, keep=0, granule=1)  # buffers of exactly the prompt
    prompts = [random_tokens(n, seed=n) for n in (5, 130, 300)]
    pasts, alone = [], []
    for prompt in prompts:
        past = past_from_blocks([], 0, exact.acquire(len(prompt)))
        prefill(model, prompt, past, 0)
        pasts.append(past)
        single = past_from_blocks([], 0, engine.buffers.acquire(len(prompt) + 1))
        prefill(model, prompt, single, 0)
        alone.append(decode_step(model, 7, single, len(prompt)))
    batched = decode_batch(model, [7, 7, 7], pasts, [len(p) for p in prompts])
    for row, expected, past, prompt in zip(batched, alone, pasts, prompts, strict=True):
        assert torch.allclose(row, expected, atol=1e-5)
        assert past.get_seq_length() == len(prompt) + 1
    engine.close()


def test_concurrent_requests_decode_together_and_answer_as_alone(cached, cold) -> None:
    """Four prompts at once: fewer forward passes than decoded tokens, and every answer (greedy,
    EOS banned so all run 120 tokens) equals the cold server's answer alone."""
    prompts = [random_tokens(n, seed=40 + n) for n in (60, 200, 333, 129)]
    body = {"logit_bias": {str(cached.engine.loaded.tokenizer.eos_token_id): -100}}
    expected = [cold.complete(p, max_tokens=120, **body).key for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: cached.complete(p, max_tokens=120, **body), prompts))
    assert [r.key for r in results] == expected
    stats = cached.engine.stats()
    assert stats.decode_steps < stats.decode_tokens == 4 * 120  # the last token fed as each ends


def test_a_short_request_finishes_while_a_long_one_streams(cached) -> None:
    """B (one token) is sent once A (2,000 tokens, streaming) has started: B's answer arrives
    while A is still streaming, not after A's whole generation."""
    url = f"{cached.server.base_url}/v1/completions"
    eos = str(cached.engine.loaded.tokenizer.eos_token_id)
    long = {"model": "tiny", "prompt": random_tokens(50, seed=1), "max_tokens": 2000, "stream": True}
    started, a_done = threading.Event(), threading.Event()

    def stream_a() -> None:
        with httpx.stream("POST", url, json=long | {"logit_bias": {eos: -100}}, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    started.set()
        a_done.set()

    a = threading.Thread(target=stream_a)
    a.start()
    assert started.wait(60)
    b = httpx.post(
        url, json={"model": "tiny", "prompt": random_tokens(20, seed=2), "max_tokens": 1}, timeout=60
    )
    b_finished_first = not a_done.is_set()
    a.join()
    assert b.status_code == 200 and b_finished_first


def test_a_short_request_is_not_held_up_by_a_long_prefill(settings, default_model, serve) -> None:
    """B (20 tokens) is sent while A's 2,000-token prompt is being prefilled (about 8 chunks of
    256): B is answered before A, whose prefill takes turns with B's."""
    with serve(settings, default_model) as server:
        url = f"{server.base_url}/v1/completions"
        engine = server.app.state.engine
        done: list[str] = []

        def send(name: str, tokens: int) -> None:
            prompt = random_tokens(tokens, seed=tokens)
            body = {"model": default_model.name, "prompt": prompt, "max_tokens": 1}
            assert httpx.post(url, json=body, timeout=300).status_code == 200
            done.append(name)

        a = threading.Thread(target=send, args=("A", 2000))
        a.start()
        wait_for(lambda: engine.running, what="A to be admitted")
        send("B", 20)
        a.join()
    assert done == ["B", "A"]
