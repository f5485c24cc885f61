"""Tool-call formats: how a model family writes calls, and the grammar that makes it write them.

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after any text
  (Qwen2.5, Qwen3, Hermes 2/3, SmolLM3 and other templates that write ``<tool_call>``).
- ``llama3``: the answer is ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3 templates).
- ``generic``: every other template. The tools and the answer format go into the system prompt
  (``proxy.tools.prompt``), and the answer is always one JSON object, decoded under a grammar:
  ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or ``{"response": "..."}`` (as
  llama.cpp's generic handler does), so any model can call tools. A model never trained on it
  tends to repeat calls, so it makes one call per answer unless the request asks for parallel
  calls (``parallel_tool_calls: true``), as llama.cpp does.

Native formats are rendered by the model's own template and read from free text under
``tool_choice: auto``; under ``required`` or a named tool they are decoded under a grammar too.
See docs/tools.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.tools import grammars
from proxy.tools.partial import string_prefix, value_end
from proxy.tools.spec import ToolSet, dumps, json_value


@dataclass
class Parsed:
    """An answer read as text and calls. While it streams, both only ever grow: ``content``
    gains characters, each call's ``arguments`` (JSON text) gains characters until ``done``."""

    content: str = ""
    calls: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, arguments, done)


class ToolFormat:
    """A family's call syntax (see the module docstring)."""

    name = ""
    native = True
    """The model's chat template renders the tools and the calls in the history."""

    def grammar(self, tools: ToolSet) -> str | None:
        """The grammar of a whole answer, or None to decode freely."""
        raise NotImplementedError

    def partial(self, text: str) -> Parsed:
        """What the answer so far already says (streaming)."""
        raise NotImplementedError

    def parse(self, text: str, tools: ToolSet) -> Parsed:
        """The whole answer: its well-formed calls (of an answer cut short, those it finished),
        else all of it as text."""
        parsed = self.partial(text)
        known = {t.name for t in tools.callable}
        calls: list[tuple[str, str, bool]] = [
            (n, a, d) for n, a, d in parsed.calls if d and n in known and isinstance(json_value(a), dict)
        ]
        return Parsed(parsed.content, calls) if calls else Parsed(text)


class Generic(ToolFormat):
    name, native = "generic", False
    RESPONSE, CALLS = '{"response": ', '{"tool_calls": ['

    def grammar(self, tools: ToolSet) -> str | None:
        callable_ = tools.callable
        more = ' ("," " " call)*' if tools.parallel is True else ""
        calls = f"calls: {grammars.literal(self.CALLS)} call{more} {grammars.literal(']}')}"
        response = f"response: {grammars.literal(self.RESPONSE)} {grammars.embedded({'type': 'string'})} "
        response += grammars.literal("}")
        if not callable_:
            return grammars.lark_grammar(f"start: response\n{response}")
        start = "start: calls | response" if tools.mode == "auto" else "start: calls"
        return grammars.lark_grammar(f"{start}\n{calls}\n{response}\n{grammars.call_rules(callable_)}")

    def partial(self, text: str) -> Parsed:
        if text.startswith(self.RESPONSE + '"'):
            return Parsed(string_prefix(text, len(self.RESPONSE)))
        if not text.startswith(self.CALLS):
            return Parsed()
        return Parsed("", _calls(text, len(self.CALLS), ", ", "arguments"))

    def parse(self, text: str, tools: ToolSet) -> Parsed:
        try:
            answer = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # NOTE: cut short (max_tokens), or nested past
            # Python's parser (a model can write a thousand brackets): what it says so far, as streamed
            return self.partial(text)
        if isinstance(answer, dict) and set(answer) == {"response"} and isinstance(answer["response"], str):
            return Parsed(answer["response"])
        return super().parse(text, tools)

    # NOTE: the generic answer is always decoded under its grammar, so any text is a prefix of a
    # valid answer: one cut short (finish_reason "length") keeps its last call's arguments so far


class Hermes(ToolFormat):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def grammar(self, tools: ToolSet) -> str | None:
        if tools.mode not in ("required", "named"):
            return None
        one = f"{grammars.literal(self.OPEN + chr(10))} call {grammars.literal(chr(10) + self.CLOSE)}"
        start = (
            f"start: tc{' (' + grammars.literal(chr(10)) + ' tc)*' if tools.parallel is not False else ''}"
        )
        return grammars.lark_grammar(f"{start}\ntc: {one}\n{grammars.call_rules(tools.callable)}")

    def partial(self, text: str) -> Parsed:
        first = text.find(self.OPEN)
        if first < 0:
            held = next((k for k in range(len(self.OPEN) - 1, 0, -1) if text.endswith(self.OPEN[:k])), 0)
            return Parsed(text[: len(text) - held].rstrip())
        calls = []
        for block in text[first:].split(self.OPEN)[1:]:
            body, closed, _ = block.partition(self.CLOSE)
            call = _named_call(body, "arguments") if closed else None
            if call is None:
                break
            calls.append(call)
        return Parsed(text[:first].rstrip(), calls)


class Llama3(ToolFormat):
    name = "llama3"
    TAG = "<|python_tag|>"

    def grammar(self, tools: ToolSet) -> str | None:
        if tools.mode not in ("required", "named"):
            return None
        more = f" ({grammars.literal('; ')} call)*" if tools.parallel is not False else ""
        return grammars.lark_grammar(
            f"start: call{more}\n{grammars.call_rules(tools.callable, 'parameters')}"
        )

    def partial(self, text: str) -> Parsed:
        body = text.lstrip().removeprefix(self.TAG)
        if body and not body.startswith("{"):
            return Parsed(text)
        calls = [_named_call(part, "parameters") for part in body.split("; ")] if body else []
        if not calls or None in calls:  # not (yet) calls: say nothing until the answer is whole
            return Parsed()
        return Parsed("", [c for c in calls if c is not None])


FORMATS: tuple[ToolFormat, ...] = (Hermes(), Llama3())


def tool_format(tokenizer: Any) -> ToolFormat:
    """The format of the model's chat template: the first native one it writes, else generic."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if Hermes.OPEN in template:
        return FORMATS[0]
    if Llama3.TAG in template or ("<|start_header_id|>" in template and '"parameters"' in template):
        return FORMATS[1]
    return Generic()


def _calls(text: str, pos: int, separator: str, key: str) -> list[tuple[str, str, bool]]:
    """The calls of a ``[{"name": ..., "<key>": ...}, ...]`` list whose first call is at ``pos``."""
    calls: list[tuple[str, str, bool]] = []
    while text.startswith('{"name": "', pos):
        name_end = text.find('"', pos + 10)
        head = f'", "{key}": '
        if name_end < 0 or not text.startswith(head, name_end):
            break
        start = name_end + len(head)
        end = value_end(text, start)
        calls.append(
            (text[pos + 10 : name_end], text[start : len(text) if end is None else end], end is not None)
        )
        if end is None or not text.startswith("}" + separator, end):
            break
        pos = end + 1 + len(separator)
    return calls


def _named_call(body: str, key: str) -> tuple[str, str, bool] | None:
    """``(name, arguments JSON, True)`` of one ``{"name": ..., "<key>": {...}}`` text."""
    try:
        call = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get(key, call.get("arguments", {}))
    return call["name"], dumps(arguments), True
