"""Anthropic's Messages API turns with the official ``anthropic`` SDK (tiny model, real Redis, real
HTTP): a final assistant turn (a prefill) is continued, not answered as a new turn, whole,
streamed and from the cache alike; the text Anthropic refuses (empty or blank text blocks, empty
messages, a prefill ending in whitespace) is refused in its shape, naming the field."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.replicas import text

QUESTION = "Tell me about the prefix cache. " + text(5, 120)  # about 200 tokens: one full block
PREFILL = "The prefix cache is"


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def prefilled(prefill: str = PREFILL) -> list[dict]:
    return [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": prefill}]


def open_turn_ids(tiny_model, messages: list[dict]) -> list[int]:
    """The prompt transformers' own ``continue_final_message`` renders: the prefill's text last."""
    rendered = tiny_model.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tiny_model.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def total(usage) -> int:
    """The prompt's length: the three input counts add up to it."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_a_prefill_is_continued_not_answered_as_a_new_turn(cached, tiny_model) -> None:
    """The prompt ends with the prefill's text (no end-of-turn, no new assistant header): its length
    is the open turn's (count_tokens and usage), and the answer is what /v1/completions gives for
    those very token ids, the continuation alone."""
    sdk, ids = client(cached.server), open_turn_ids(tiny_model, prefilled())
    assert tiny_model.tokenizer.decode(ids).endswith("<|im_start|>assistant\n" + PREFILL)
    counted = sdk.messages.count_tokens(model="tiny", messages=prefilled())
    assert counted.input_tokens == len(ids)
    reply = sdk.messages.create(
        model="tiny", max_tokens=8, messages=prefilled(), extra_body={"temperature": 0}
    )
    assert total(reply.usage) == len(ids)
    completion = httpx.post(
        f"{cached.server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0},
        timeout=120,
    ).json()
    assert reply.content[0].text == completion["choices"][0]["text"]


def test_a_prefilled_answer_from_the_cache_equals_the_uncached_one(cached) -> None:
    """The same prefilled request three times (whole, whole, streamed): the first computes the
    prompt, the others read its full block from the cache; all give one continuation."""
    sdk = client(cached.server)
    first = sdk.messages.create(
        model="tiny", max_tokens=8, messages=prefilled(), extra_body={"temperature": 0}
    )
    second = sdk.messages.create(
        model="tiny", max_tokens=8, messages=prefilled(), extra_body={"temperature": 0}
    )
    with sdk.messages.stream(
        model="tiny", max_tokens=8, messages=prefilled(), extra_body={"temperature": 0}
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens >= 128 and final.usage.cache_read_input_tokens >= 128
    assert first.content[0].text == second.content[0].text == streamed


def test_consecutive_turns_of_one_role_are_one_turn(cached) -> None:
    """Anthropic combines consecutive turns of one role: a prefill sent as two assistant messages
    (and a question as two user messages) is answered as the combined turn is, same prompt."""
    sdk, half = client(cached.server), len(PREFILL) // 2
    split = [
        {"role": "user", "content": QUESTION[:40]},
        {"role": "user", "content": [{"type": "text", "text": QUESTION[40:]}]},
        {"role": "assistant", "content": PREFILL[:half]},
        {"role": "assistant", "content": [{"type": "text", "text": PREFILL[half:]}]},
    ]
    options = {"model": "tiny", "max_tokens": 8, "extra_body": {"temperature": 0}}
    whole, parts = (
        sdk.messages.create(messages=prefilled(), **options),
        sdk.messages.create(messages=split, **options),
    )
    assert (parts.content[0].text, total(parts.usage)) == (whole.content[0].text, total(whole.usage))
    counted = sdk.messages.count_tokens(model="tiny", messages=split).input_tokens
    assert counted == sdk.messages.count_tokens(model="tiny", messages=prefilled()).input_tokens


def test_an_empty_final_assistant_turn_is_no_prefill(cached) -> None:
    """``""`` or ``[]`` as the final assistant turn (Anthropic allows it): the answer is a new turn,
    the same as without it."""
    sdk = client(cached.server)
    asked = [{"role": "user", "content": QUESTION}]
    plain = sdk.messages.create(model="tiny", max_tokens=6, messages=asked, extra_body={"temperature": 0})
    for empty in ("", []):
        messages = [*asked, {"role": "assistant", "content": empty}]
        reply = sdk.messages.create(
            model="tiny", max_tokens=6, messages=messages, extra_body={"temperature": 0}
        )
        assert reply.content[0].text == plain.content[0].text
        assert total(reply.usage) == total(plain.usage)


EMPTY = "text content blocks must be non-empty"
BLANK = "text content blocks must contain non-whitespace text"
NO_CONTENT = "all messages must have non-empty content except for the optional final assistant message"
TRAILING = "final assistant content cannot end with trailing whitespace"
HI = {"role": "user", "content": "hi"}
REFUSED = [
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
        "messages[0].content[0].text",
        EMPTY,
    ),
    ({"system": [{"type": "text", "text": ""}], "messages": [HI]}, "system[0].text", EMPTY),
    ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content", NO_CONTENT),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", NO_CONTENT),
    ({"messages": [HI, {"role": "assistant", "content": ""}, HI]}, "messages[1].content", NO_CONTENT),
    ({"messages": [{"role": "user", "content": " \n "}]}, "messages[0].content", BLANK),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "\t"}]}
            ]
        },
        "messages[0].content[1].text",
        BLANK,
    ),
    ({"messages": [HI, {"role": "assistant", "content": "Sure, "}]}, "messages[1].content", TRAILING),
    (
        {"messages": [HI, {"role": "assistant", "content": [{"type": "text", "text": "Sure\n"}]}]},
        "messages[1].content[0].text",
        TRAILING,
    ),
    (
        {"messages": [HI, {"role": "assistant", "content": [{"type": "text", "text": ""}]}]},
        "messages[1].content[0].text",
        EMPTY,
    ),
]


@pytest.mark.parametrize(("body", "field", "says"), REFUSED, ids=[f"{c[1]}-{c[2][:20]}" for c in REFUSED])
def test_text_anthropic_refuses_is_refused_naming_the_field(cached, body, field, says) -> None:
    """The SDK's ``BadRequestError`` in Anthropic's shape with Anthropic's words and the field, on
    /v1/messages and /v1/messages/count_tokens alike; nothing is computed."""
    sdk = client(cached.server)
    for call in (sdk.messages.create, sdk.messages.count_tokens):
        extra = {"max_tokens": 4} if call == sdk.messages.create else {}
        with pytest.raises(anthropic.BadRequestError) as refused:
            call(model="tiny", **body, **extra)
        error = refused.value.body
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"] == f"{field}: {says}"
    stats = httpx.get(f"{cached.server.base_url}/stats", timeout=30).json()
    assert stats["process"]["requests"] == 0


def test_an_empty_text_block_in_a_tool_result_is_refused(cached) -> None:
    """A ``tool_result``'s own text blocks are text blocks too."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": ""}]}
    messages = [HI, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(cached.server).messages.create(model="tiny", max_tokens=4, messages=messages, tools=tools)
    assert refused.value.body["error"]["message"] == f"messages[2].content[0].content[0].text: {EMPTY}"
