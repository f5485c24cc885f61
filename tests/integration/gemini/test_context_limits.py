"""Gemini requests over the context, in Google's words (official ``google-genai`` client, tiny
model served with a 256-token context, real HTTP): 400 ``INVALID_ARGUMENT`` with "The input token
count (N) exceeds the maximum number of tokens allowed (M)." for contents that do not fit
(``generateContent``, ``streamGenerateContent``, ``cachedContents``), and the ``maxOutputTokens``
range this prompt leaves when they fit but not with it; the numbers are the request's, and the
largest value in that range is served. Nothing is computed or stored for a refusal."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.replicas import text

CONTEXT = 256
INPUT_TOO_LONG = re.compile(
    r"^The input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)\.$"
)
OUTPUT_RANGE = re.compile(
    r"^Unable to submit request because it has a maxOutputTokens value of (\d+) but the supported "
    r"range is from 1 \(inclusive\) to (\d+) \(exclusive\)\. Update the value and try again\.$"
)
LONG = text(11, 300)  # about 480 tokens
FITS = text(12, 100)  # about 160 tokens


@pytest.fixture
def server(settings, tiny_model, serve) -> Iterator:
    with serve(settings, dataclasses.replace(tiny_model, context_length=CONTEXT)) as running:
        yield running


def gemini(server) -> genai.Client:
    options = types.HttpOptions(base_url=server.base_url, api_version="v1beta", timeout=120_000)
    return genai.Client(api_key="unused", http_options=options)


def refusal(call, *args, **kwargs) -> genai_errors.ClientError:
    with pytest.raises(genai_errors.ClientError) as refused:
        result = call(*args, **kwargs)
        if not isinstance(result, types.GenerateContentResponse | types.CachedContent):
            list(result)  # NOTE: a stream's error comes when it is read
    error = refused.value
    assert (error.code, error.status) == (400, "INVALID_ARGUMENT")
    return error


def numbers(pattern: re.Pattern[str], error: genai_errors.ClientError) -> tuple[int, ...]:
    found = pattern.match(error.message or "")
    assert found is not None, error.message
    return tuple(int(g) for g in found.groups())


@pytest.mark.parametrize("stream", [False, True])
def test_contents_over_the_context_are_an_input_token_count_error(server, settings, stream) -> None:
    """Contents longer than the context: their token count (as countTokens gives it) over the
    longest prompt that leaves a token to generate; streamed or not; nothing stored."""
    client = gemini(server)
    n = client.models.count_tokens(model="tiny", contents=LONG).total_tokens
    call = client.models.generate_content_stream if stream else client.models.generate_content
    error = refusal(call, model="tiny", contents=LONG)
    assert numbers(INPUT_TOO_LONG, error) == (n, CONTEXT - 1)
    assert not list(settings.blob_root.rglob("*.safetensors"))


def test_max_output_tokens_past_what_the_context_leaves_is_out_of_range(server) -> None:
    """Contents that fit, with ``maxOutputTokens`` the whole context: the range ends (exclusive)
    one past what the context leaves after them; its largest value is served."""
    client = gemini(server)
    n = client.models.count_tokens(model="tiny", contents=FITS).total_tokens
    config = types.GenerateContentConfig(max_output_tokens=CONTEXT, temperature=0)
    error = refusal(client.models.generate_content, model="tiny", contents=FITS, config=config)
    asked, end = numbers(OUTPUT_RANGE, error)
    assert (asked, end) == (CONTEXT, CONTEXT - n + 1)

    config = types.GenerateContentConfig(max_output_tokens=end - 1, temperature=0)
    served = client.models.generate_content(model="tiny", contents=FITS, config=config)
    assert served.usage_metadata.prompt_token_count == n


def test_a_cached_content_over_the_context_is_an_input_token_count_error(server) -> None:
    """``cachedContents`` with contents longer than the context: the same error, nothing kept."""
    client = gemini(server)
    config = types.CreateCachedContentConfig(
        contents=[types.Content(role="user", parts=[types.Part(text=LONG)])]
    )
    error = refusal(client.caches.create, model="tiny", config=config)
    n, most = numbers(INPUT_TOO_LONG, error)
    assert n > most == CONTEXT - 1
    assert list(client.caches.list()) == []
