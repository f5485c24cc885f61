"""proxy/serving/validation.py and proxy/openai/protocol.py: what a body may ask, and the TTL it gets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import Settings
from proxy.openai.protocol import ChatCompletionRequest, CompletionRequest, usage
from proxy.serving.validation import cache_ttl, kept_ttl, token_bias


def test_retention_is_the_server_ttl_or_a_day_capped_by_max_ttl() -> None:
    settings = Settings(ttl=600, max_ttl=3600)
    assert cache_ttl(settings, None) == cache_ttl(settings, "in_memory") == 600
    assert cache_ttl(settings, "24h") == 3600
    assert cache_ttl(Settings(ttl=600, max_ttl=10**6), "24h") == 86_400


def test_a_client_ttl_lengthens_retention_but_never_shortens_it() -> None:
    """``--client-ttl floor``: each TTL of a plan at least ``--ttl`` (``--max-ttl`` bounding it),
    the server's own (None) left as it is; ``exact``: the plan as asked."""
    floor = Settings(ttl=3600, max_ttl=86_400)
    assert kept_ttl(floor, (300, 300, None)) == (3600, 3600, None)
    assert kept_ttl(floor, (7200, 300)) == (7200, 3600)
    assert kept_ttl(floor, 300) == 3600 and kept_ttl(floor, None) is None
    assert kept_ttl(Settings(ttl=3600, max_ttl=600), (300,)) == (600,)
    exact = Settings(ttl=3600, client_ttl="exact")
    assert kept_ttl(exact, (300, None)) == (300, None) and kept_ttl(exact, 300) == 300


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_the_server_cannot_honour_is_named(body, param) -> None:
    request = ChatCompletionRequest(
        **({"model": "m", "messages": [{"role": "user", "content": "hi"}]} | body)
    )
    assert request.unsupported_field()[0] == param  # type: ignore[index]


def test_completions_refuse_suffix_best_of_and_echo_with_logprobs() -> None:
    for body, param in (
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ):
        assert CompletionRequest(model="m", prompt="p", **body).unsupported_field()[0] == param  # type: ignore[index]


def test_strict_types_and_logit_bias_keys() -> None:
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt="p", max_tokens="5")
    request = CompletionRequest(model="m", prompt="p", logit_bias={"7": 5.0})
    assert token_bias(request.logit_bias, 100) == {7: 5.0}
    with pytest.raises(ValueError, match="not a token id"):
        token_bias(CompletionRequest(model="m", prompt="p", logit_bias={"x": 1.0}).logit_bias, 100)


def test_usage_always_carries_cached_tokens() -> None:
    assert usage(300, 5, 0)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage(300, 5, 256)["total_tokens"] == 305


def test_unknown_fields_are_ignored() -> None:
    """A field the server does not know (a newer API's, a vendor's) is neither refused nor named."""
    chat = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], a_newer_field={"x": 1}
    )
    assert chat.unsupported_field() is None
    assert CompletionRequest(model="m", prompt="p", vendor_option=True).unsupported_field() is None
