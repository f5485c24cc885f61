"""The OpenAI Responses API's request (``POST /v1/responses``), the same request as a chat
completion, and the response's usage: kvproxy serves a response through the chat route's one path
(``proxy.openai.chat.start_chat``), so a conversation gets the same prompt, and with greedy
decoding the same answer, through either API.

Source: the OpenAI API reference, Responses (create; function tools; ``text.format``). Unknown
fields are accepted and ignored (``include``, ``reasoning``, ``truncation``, ...); fields that
would change the answer and cannot be honoured are refused, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatCompletionRequest, Count, Real
from proxy.responses.replies import ResponseUsage
from proxy.responses.tools import ToolPlan, chat_tool_choice, echoed_tool, tool_plan
from proxy.serving.metadata import LeftOut
from proxy.tools.limits import MAX_TOOLS, check_tool_count
from proxy.tools.rendering import TemplateMessage

if TYPE_CHECKING:
    from proxy.serving.turn import Usage

UNSUPPORTED = {
    "background": "background responses are not supported; send the request and wait, or stream it",
    "conversation": "conversation objects are not supported; continue with `previous_response_id`",
    "prompt": "prompt templates are not supported; send `input` and `instructions`",
}
"""Fields refused when set, and why."""
ECHO_TEXT_MOST = 512
"""The most characters of ``user`` and of an input item's ``id`` or ``call_id``: fields a stored
response keeps and echoes that the model never reads, bounded as a ``metadata`` value is (OpenAI:
512 characters)."""
ECHO_JSON_MOST = 2048
"""The most characters of ``tool_choice``, and of ``text`` beside its format's ``schema``, as
compact JSON: echoed whole in a stored response, never read by the model (a function's name,
a format's type, name, description and strictness fit many times over)."""
ALLOWED_TOOLS_JSON_MOST = MAX_TOOLS * 256
"""The most characters of an ``allowed_tools`` tool choice as compact JSON: every tool a request
may define, each named with its namespace (two names of at most 64 characters, and the keys)."""


class ResponsesRequest(BaseModel):
    """The fields of a Responses request kvproxy reads."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: StrictStr | list[dict[str, Any]] = Field(default_factory=list)
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    max_output_tokens: Count | None = None
    temperature: Real | None = Field(None, ge=0, le=2)
    top_p: Real | None = Field(None, gt=0, le=1)
    text: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    store: StrictBool = True
    metadata: dict[str, StrictStr] | None = Field(None, max_length=16)
    stream: StrictBool = False
    user: str | None = None
    prompt_cache_retention: str | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field this server cannot honour, if any."""
        for name, reason in UNSUPPORTED.items():
            if (self.model_extra or {}).get(name):
                return name, reason
        for key, value in (self.metadata or {}).items():
            if len(key) > 64 or len(value) > 512:
                return "metadata", "metadata keys are at most 64 characters and values at most 512"
        if (echoed := self.oversized_echo()) is not None:
            return echoed
        if not self.input and self.previous_response_id is None:
            return "input", "a response needs `input` (or `previous_response_id` to continue from)"
        return None

    def oversized_echo(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field a stored response would echo past its bound
        (``ECHO_TEXT_MOST``, ``ECHO_JSON_MOST``): a response is stored whole, so a field the model
        never reads would otherwise fill the tenant's share of the store with one request."""
        if self.user is not None and len(self.user) > ECHO_TEXT_MOST:
            return "user", f"user is at most {ECHO_TEXT_MOST} characters"
        for i, item in enumerate(self.input if isinstance(self.input, list) else []):
            for key in ("id", "call_id"):
                value = item.get(key) if isinstance(item, dict) else None
                if isinstance(value, str) and len(value) > ECHO_TEXT_MOST:
                    return f"input[{i}].{key}", f"an item's {key} is at most {ECHO_TEXT_MOST} characters"
        text = dict(self.text or {})
        if isinstance(text.get("format"), dict):
            text["format"] = {k: v for k, v in text["format"].items() if k != "schema"}
        allowed = isinstance(self.tool_choice, dict) and self.tool_choice.get("type") == "allowed_tools"
        choice_most = ALLOWED_TOOLS_JSON_MOST if allowed else ECHO_JSON_MOST
        for name, value, most in (
            ("tool_choice", self.tool_choice, choice_most),
            ("text", text, ECHO_JSON_MOST),
        ):
            if len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) > most:
                where = " beside text.format.schema" if name == "text" else ""
                return name, f"{name}{where} is at most {most} characters as JSON"
        return None

    def echoed_tools(self) -> list[Any]:
        """``tools`` as a stored response echoes them (``proxy.responses.tools.echoed_tool``)."""
        return [echoed_tool(t) for t in self.tools or []]

    def system_messages(self) -> list[TemplateMessage]:
        """``instructions`` as the system message the chat starts with (none when empty)."""
        return [{"role": "system", "content": self.instructions}] if self.instructions else []

    def chat_request(
        self, messages: list[TemplateMessage], plan: ToolPlan | None = None
    ) -> ChatCompletionRequest:
        """This request as the chat completion of ``messages`` (``system_messages``, any stored
        conversation, then the input items as ``proxy.responses.history.chat_messages`` writes
        them): what ``/v1/responses`` starts, and what ``kvproxy route`` renders.

        Raises:
            OpenAIError: as ``chat_fields``.
            pydantic.ValidationError: a field the chat completion refuses.
        """
        return ChatCompletionRequest.model_validate({"messages": messages} | self.chat_fields(plan))

    def chat_fields(self, plan: ToolPlan | None = None) -> dict[str, Any]:
        """The chat completion fields this request asks for, besides its messages: its tools as
        ``plan`` offers them (``proxy.responses.tools.tool_plan`` of ``tools`` when None).

        Raises:
            OpenAIError: 400 naming the field: a malformed tool, a tool choice or text format
                that is not one of Responses' own, more functions than
                ``proxy.tools.limits.MAX_TOOLS``.
        """
        fields: dict[str, Any] = {
            "model": self.model,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "user": self.user,
            "prompt_cache_retention": self.prompt_cache_retention,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        plan = tool_plan(self.tools) if plan is None else plan
        if plan.chat:
            check_tool_count(plan.chat)
            fields["tools"] = plan.chat
        if self.tool_choice is not None:
            fields["tool_choice"] = chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.get("format") is not None:
            fields["response_format"] = chat_format(self.text["format"])
        return {k: v for k, v in fields.items() if v is not None}


def chat_format(form: object) -> dict[str, Any]:
    """``text.format`` (``text``, ``json_object``, or ``json_schema`` with its name, schema and
    strictness at the top level) as chat's ``response_format``.

    Raises:
        OpenAIError: 400 naming ``text.format`` for a format that is not an object.
    """
    if not isinstance(form, dict) or not isinstance(form.get("type"), str):
        raise OpenAIError(400, "text.format is an object with a `type`", param="text.format.type")
    if form["type"] != "json_schema":
        return {"type": form["type"]}
    schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
    return {"type": "json_schema", "json_schema": schema}


PARAMS = (
    ("messages", "input"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
)


def responses_param(param: str | None) -> str | None:
    """A chat request's field name as the Responses request names it (``messages[2].content`` ->
    ``input``, ``tools[0].function.parameters`` -> ``tools[0].parameters``)."""
    if param is None:
        return None
    for chat, ours in PARAMS:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            return ours if chat == "messages" else ours + param[len(chat) :]
    return param.replace(".function.", ".", 1) if param.startswith("tools[") else param


def responses_left_out(left_out: tuple[LeftOut, ...], instructions: bool) -> tuple[LeftOut, ...]:
    """The client metadata a chat turn left out (``proxy.serving.metadata``), each named as the
    Responses request names its field: ``instructions`` (the chat's first system message, when
    the request has instructions), else ``input``."""
    first = "instructions" if instructions else "input"
    return tuple(
        dataclasses.replace(out, param=first if out.param.startswith("messages[0].") else "input")
        for out in left_out
    )


def usage(counts: Usage) -> ResponseUsage:
    """Responses usage: ``input_tokens_details.cached_tokens`` served from the cache,
    ``cache_write_tokens`` newly stored (``proxy.serving.running.written_tokens``)."""
    return {
        "input_tokens": counts.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": counts.cached_tokens,
            "cache_write_tokens": counts.written_tokens,
        },
        "output_tokens": counts.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts.total_tokens,
    }
