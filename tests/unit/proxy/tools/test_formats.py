"""Tool-call formats read answers whole and while they stream: the streamed pieces add up to the
whole answer, a cut-short answer keeps the calls it finished, and JSON still being written is
never guessed."""

from __future__ import annotations

import json

from proxy.tools.answer import AnswerPlan
from proxy.tools.formats import Generic, Hermes, Llama3
from proxy.tools.partial import string_prefix, value_end
from proxy.tools.spec import Arguments, CallStart, Text, Tool, ToolSet

TOOLS = ToolSet((Tool("get_weather", "", {"type": "object"}),))


def _streamed(plan: AnswerPlan, text: str) -> tuple[str, list[tuple[str, str]]]:
    """Feed ``text`` one character at a time; what the pieces say."""
    stream, content, calls = plan.stream(), "", {}
    pieces = [p for ch in text for p in stream.feed(ch)]
    more, _ = stream.finish("")
    for piece in pieces + more:
        if isinstance(piece, Text):
            content += piece.text
        elif isinstance(piece, CallStart):
            calls[piece.index] = [piece.name, ""]
        elif isinstance(piece, Arguments):
            calls[piece.index][1] += piece.text
    return content, [tuple(c) for c in calls.values()]


def test_each_format_reads_its_calls_whole_and_streamed() -> None:
    """Generic, hermes and llama3 answers: the same calls and text, whole or streamed."""
    args = '{"city": "Paris", "days": [1, {"x": "}"}]}'
    cases = [
        (Generic(), f'{{"tool_calls": [{{"name": "get_weather", "arguments": {args}}}]}}', ""),
        (
            Hermes(),
            f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>',
            "Let me look.",
        ),
        (Llama3(), f'{{"name": "get_weather", "parameters": {args}}}', ""),
    ]
    for fmt, text, content in cases:
        plan = AnswerPlan(fmt, TOOLS)
        whole, calls = plan.read(text)
        assert whole == content and [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", json.loads(args))
        ]
        streamed = _streamed(plan, text)
        assert streamed[0] == content and [(n, json.loads(a)) for n, a in streamed[1]] == [
            ("get_weather", json.loads(args))
        ]


def test_text_answers_and_escapes_stream_as_text() -> None:
    """A generic response's escapes decode only once whole; hermes text holds back a marker's start."""
    text = '{"response": "caf\\u00e9 \\"ok\\" \\ud83d\\ude00"}'
    assert _streamed(AnswerPlan(Generic(), TOOLS), text) == ('café "ok" 😀', [])
    assert AnswerPlan(Generic(), TOOLS).read(text) == ('café "ok" 😀', [])
    assert Hermes().partial("Hello <tool_c").content == "Hello"
    assert AnswerPlan(Hermes(), TOOLS).read("Just text.") == ("Just text.", [])


def test_a_cut_short_answer_keeps_its_finished_calls() -> None:
    """max_tokens mid-call: the finished calls stay, the open one is dropped; a cut response is its text."""
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    content, calls = AnswerPlan(Generic(), TOOLS).read(f'{{"tool_calls": [{call}, {{"name": "get_we')
    assert [c.arguments for c in calls] == ['{"city": "Oslo"}'] and content == ""
    assert AnswerPlan(Generic(), TOOLS).read('{"response": "half a sent') == ("half a sent", [])


def test_partial_json_is_never_guessed() -> None:
    """An open value has no end; a string's text waits for whole escapes and surrogate pairs."""
    assert value_end('{"a": [1, 2', 0) is None and value_end('{"a": "]"}', 0) == 10
    assert string_prefix('"ab\\u00', 0) == "ab" and string_prefix('"x\\ud83d', 0) == "x"
