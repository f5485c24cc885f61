"""How a request's answer is asked for and read back: the grammar it is decoded under, and its
text split into content and tool calls, whole or while it streams."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from engine.constraint import GrammarError, check_grammar
from proxy.http.errors import OpenAIError
from proxy.tools import grammars
from proxy.tools.formats import Parsed, ToolFormat, tool_format
from proxy.tools.prompt import answer_turn
from proxy.tools.rendering import TemplateMessage, special_strings
from proxy.tools.spec import Arguments, CallStart, Piece, Text, ToolCall, ToolSet, call_id


@dataclass(frozen=True)
class AnswerPlan:
    """A request's answer: its format, its tools (None: no tools), its grammar (None: free), and
    what its grammar leaves unenforced (``unenforced``: one line per tool and keyword)."""

    format: ToolFormat
    tools: ToolSet | None = None
    grammar: str | None = None
    id_prefix: str = "call_"
    warnings: tuple[str, ...] = ()

    @property
    def reads_calls(self) -> bool:
        """Whether the answer is read as calls and text (else it is all text)."""
        return self.tools is not None and (not self.format.native or self.tools.mode != "none")

    def read(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole answer: its text and its calls (none when they are not well formed)."""
        if not self.reads_calls:
            return text, []
        assert self.tools is not None
        parsed = self.format.parse(text, self.tools)
        return parsed.content, [ToolCall(call_id(self.id_prefix), n, a) for n, a, _ in parsed.calls]

    def history_message(self, text: str, echo: Callable[[str], str] | None = None) -> TemplateMessage:
        """A whole answer as a later request's history renders it (``answer_turn``): read as
        its text and calls, each call's arguments as the client sends them back (``echo``;
        ``Turn.echo_arguments``). What render-ahead renders: the model's own text may differ
        from it (a call's arguments serialized again, an escape written another way)."""
        content, calls = self.read(text)
        if echo is not None:
            calls = [dataclasses.replace(call, arguments=echo(call.arguments)) for call in calls]
        return answer_turn(content, calls, self.tools, self.format)

    def stream(self) -> AnswerStream:
        return AnswerStream(self)


@dataclass
class AnswerStream:
    """An answer read as it streams: ``feed`` each text delta, ``finish`` with the rest; both
    return the pieces not said before (each call's id is made once, at its start)."""

    plan: AnswerPlan
    text: str = ""
    said: int = 0
    calls: list[list[Any]] = field(default_factory=list)  # [id, name, arguments said]

    def feed(self, delta: str) -> list[Piece]:
        self.text += delta
        if not self.plan.reads_calls:
            return self._diff(Parsed(self.text))
        return self._diff(self.plan.format.partial(self.text))

    def finish(self, rest: str) -> tuple[list[Piece], list[ToolCall]]:
        """The last pieces, and the answer's calls."""
        self.text += rest
        if not self.plan.reads_calls:
            return self._diff(Parsed(self.text)), []
        assert self.plan.tools is not None
        parsed = self.plan.format.parse(self.text, self.plan.tools)
        pieces = self._diff(parsed)
        calls = [ToolCall(c[0], c[1], a) for c, (_, a, _) in zip(self.calls, parsed.calls, strict=False)]
        return pieces, calls

    def _diff(self, parsed: Parsed) -> list[Piece]:
        pieces: list[Piece] = []
        if len(parsed.content) > self.said:
            pieces.append(Text(parsed.content[self.said :]))
            self.said = len(parsed.content)
        for i, (name, arguments, _) in enumerate(parsed.calls):
            if i == len(self.calls):
                self.calls.append([call_id(self.plan.id_prefix), name, 0])
                pieces.append(CallStart(i, self.calls[i][0], name))
            if len(arguments) > self.calls[i][2]:
                pieces.append(Arguments(i, arguments[self.calls[i][2] :]))
                self.calls[i][2] = len(arguments)
        return pieces


def plan_answer(
    tokenizer: Any,
    vocab_size: int,
    tools: ToolSet | None,
    schema: dict[str, Any] | None,
    schema_param: str,
    tools_param: str,
    id_prefix: str = "call_",
    schema_strict: bool = True,
) -> AnswerPlan:
    """The plan of a request with these tools and, for a JSON answer, this ``schema``; every
    grammar compiled for the model (run it off the event loop: the first compile is slow). A
    tool that is not ``strict``, and a ``schema`` that is not (``schema_strict``), leave out the
    keywords the grammar cannot enforce, one warning each (``unenforced``).

    Raises:
        OpenAIError: 400 naming the tool (``tools_param`` with ``{i}``) or ``schema_param`` whose
            schema cannot be enforced.
    """
    fmt = tool_format(tokenizer)
    specials = special_strings(tokenizer)
    compiled = partial(compile_grammar, tokenizer, vocab_size)
    warnings: list[str] = []
    if tools is not None:
        for i, tool in enumerate(tools.tools):
            param = tools_param.format(i=i)
            check_schema(tool.parameters, specials, param)
            lenient = not tool.strict
            _, left = compiled(
                partial(grammars.json_grammar, grammars.closed(tool.parameters), lenient), param
            )
            warnings += unenforced(param, tool.name, left)
    grammar = None
    if schema is not None:
        check_schema(schema, specials, schema_param)
        grammar, left = compiled(partial(grammars.json_grammar, schema, not schema_strict), schema_param)
        warnings += unenforced(schema_param, None, left)
    elif tools is not None:
        grammar, _ = compiled(partial(fmt.grammar, tools), "tools")
    return AnswerPlan(fmt, tools, grammar, id_prefix, tuple(warnings))


UNIMPLEMENTED = re.compile(r"^Unimplemented keys: (\[.*\])$")
"""llguidance's warning for schema keywords it leaves out (a JSON list of their names)."""
REPEATED = re.compile(r" \(\d+ times\)$")
"""What llguidance adds to a warning given more than once for one schema."""
UNKNOWN_FORMAT = "Unknown format: "
"""llguidance's warning for a ``format`` it does not know (the format follows)."""


def unenforced(param: str, name: str | None, warnings: tuple[str, ...]) -> list[str]:
    """One line per keyword llguidance left out of the grammar of a schema (``warnings``: its own
    words, ``proxy.tools.grammars.options``), naming the schema's field ``param``, the tool
    ``name`` (None: an answer's schema) and the keyword; another relaxation (``oneOf`` taken as
    ``anyOf``, ``minProperties`` over optional properties) in llguidance's words. Request text is
    JSON-quoted: a line is ASCII."""
    head = f"{param} (tool {json.dumps(name)}): " if name is not None else f"{param}: "
    lines: list[str] = []
    for warning in (REPEATED.sub("", w) for w in warnings):
        if (found := UNIMPLEMENTED.match(warning)) is not None:
            try:
                keywords = [str(k) for k in json.loads(found.group(1))]
            except json.JSONDecodeError:
                keywords = [found.group(1)]
        elif warning.startswith(UNKNOWN_FORMAT):
            keywords = [f"format: {warning.removeprefix(UNKNOWN_FORMAT)}"]
        else:
            lines.append(head + json.dumps(warning))
            continue
        lines += [f"{head}schema keyword {json.dumps(k)} is not enforced" for k in keywords]
    return list(dict.fromkeys(lines))


def check_schema(schema: dict[str, Any], specials: set[str], param: str) -> None:
    """Raises OpenAIError (400 naming ``param``) for a schema that asks for a control token as
    text (``proxy.tools.grammars.special_literal``)."""
    if (hit := grammars.special_literal(schema, specials)) is not None:
        reason = f"this schema asks for `{hit}`, a control token of this model, which no answer can write"
        raise OpenAIError(400, reason, param=param)


def compile_grammar(
    tokenizer: Any, vocab_size: int, build: Callable[[], str | None], param: str
) -> tuple[str | None, tuple[str, ...]]:
    """The grammar ``build`` makes (None: none), compiled once for the model of ``tokenizer``
    and ``vocab_size`` (slow the first time: run it off the event loop), and llguidance's
    warnings on it (what a lenient schema left unenforced: ``engine.constraint.check_grammar``).

    Raises:
        OpenAIError: 400 naming ``param`` with llguidance's message (a schema feature it does not
            support in a strict schema, a bad ``pattern``, a schema nested past its parser's
            limit).
    """
    try:
        grammar = build()
        warnings = check_grammar(tokenizer, vocab_size, grammar) if grammar is not None else ()
    except (GrammarError, ValueError) as exc:  # NOTE: llguidance's builders raise ValueError
        raise OpenAIError(400, f"this schema cannot be enforced: {exc}", param=param) from exc
    return grammar, warnings
