"""The hot-prefix panel's text (``/stats``, the dashboard) tells chats apart: on a model whose chat
template writes a default system prompt before every chat without one (as SmolLM2's does), each
prefix is labelled by its own first message, not by that prompt; a chat with a system message
by its system text. Tiny model with such a template, real Redis, real HTTP, the ``openai`` SDK."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from openai import OpenAI

from engine.model.loading import load_model
from tests.api import Api
from tests.helpers import build_tiny_model
from tests.replicas import text

DEFAULT_SYSTEM = "You are a helpful assistant named Tiny, trained on a few words"
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def defaulting_model(tmp_path_factory):
    """The tiny model with a template that writes a default system prompt (SmolLM2's way)."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-default-system"), chat_template=TEMPLATE)
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return dataclasses.replace(loaded, name="tiny")


def test_hot_prefixes_are_labelled_by_their_own_first_message(settings, defaulting_model, serve) -> None:
    """Three chats of over a block each, two without a system message, each asked twice (a hit):
    three hot prefixes, labelled by the first user message's words, or the system message's."""
    chats = {
        "Apples": [{"role": "user", "content": "Apples " + text(1, 200)}],
        "Boats": [{"role": "user", "content": "Boats " + text(2, 200)}],
        "Cats": [{"role": "system", "content": "Cats " + text(3, 100)}, {"role": "user", "content": "hi"}],
    }
    with serve(settings, defaulting_model) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        for _ in range(2):
            for messages in chats.values():
                client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
            Api(server).flush()  # NOTE: blocks are saved, then hits counted, on the writer's thread
        hot = httpx.get(f"{server.base_url}/stats", timeout=60).json()["hot_prefixes"]
    labels = sorted(row["text"] for row in hot)
    assert len(labels) == 3 and len(set(labels)) == 3, labels
    for label, (first, messages) in zip(labels, sorted(chats.items()), strict=True):
        assert label == " ".join(messages[0]["content"].split())[:60]
        assert label.startswith(first) and DEFAULT_SYSTEM[:20] not in label
