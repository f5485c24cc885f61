"""Token ids and rendering: prompt_tokens is the rendered template; key order is irrelevant."""

from __future__ import annotations

import json

import httpx

MODEL = "smollm2-135m-instruct"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
]


def test_prompt_tokens_is_the_rendered_template(settings, default_model, serve) -> None:
    """Same count as the chat template rendered with the generation prompt; no doubled markers."""
    tokenizer = default_model.tokenizer
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(im_start) == len(MESSAGES) + 1  # one per message + the generation prompt
    assert ids[0] == im_start and ids[1] != im_start
    with serve(settings, default_model) as server:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
        usage = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120).json()["usage"]
    assert usage["prompt_tokens"] == len(ids)


def test_json_key_order_changes_nothing(settings, default_model, serve) -> None:
    """The same request with its keys (and its messages' keys) in reverse order: same tokens, answer."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    reversed_body = {
        k: ([dict(reversed(list(m.items()))) for m in v] if k == "messages" else v)
        for k, v in reversed(list(body.items()))
    }
    with serve(settings, default_model) as server:
        url = f"{server.base_url}/v1/chat/completions"
        headers = {"content-type": "application/json"}
        a = httpx.post(url, content=json.dumps(body), headers=headers, timeout=120).json()
        b = httpx.post(url, content=json.dumps(reversed_body), headers=headers, timeout=120).json()
    assert json.dumps(body) != json.dumps(reversed_body)
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
