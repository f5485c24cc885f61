"""The JSON kvproxy writes for the Responses API: the response object, its usage, its items
(input items as kept and listed, output items as answered) and where a streamed event points.

Each shape is declared once here; the routes build plain dicts of these shapes, so the keys are
written in the order each builder lists them. Source: the OpenAI API reference, Responses (the
response object; input and output items; streaming events).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Status = Literal["in_progress", "completed", "incomplete"]


class ItemText(TypedDict):
    """A text part of an input message (``input_text``, or ``output_text`` for an assistant's)."""

    type: str
    text: str


class OutputText(TypedDict):
    """The text part of an output message."""

    type: Literal["output_text"]
    text: str
    annotations: list[object]
    logprobs: list[object]


class InputMessage(TypedDict):
    id: str
    type: Literal["message"]
    role: str
    content: list[ItemText]


class OutputMessage(TypedDict):
    """An answer's message (no content part yet while it is just opened)."""

    id: str
    type: Literal["message"]
    status: Status
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCall(TypedDict):
    """A call, as the model made it or as the client sends back one it made (``namespace``:
    the namespace tool its function belongs to, ``proxy.responses.tools``)."""

    id: str
    type: Literal["function_call"]
    status: Status
    call_id: str
    name: str
    namespace: NotRequired[str]
    arguments: str


class FunctionCallOutput(TypedDict):
    """A call's result, sent by the client: answering ``call_id``, or, without one (a result
    the client adds on its own, as Codex's goals do), naming the tool (``name``, ``namespace``)."""

    id: str
    type: Literal["function_call_output"]
    call_id: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    output: str


class KeptItem(TypedDict):
    """Another item a client keeps in its history, kept as sent (with an ``id``): another kind
    of tool call or result, rendered as one (``proxy.responses.history``), or an item of the
    hosted model's own (reasoning, compaction, a hosted tool's call), which the local model
    cannot read and is not shown."""

    id: str
    type: str


InputItem = InputMessage | FunctionCall | FunctionCallOutput | KeptItem
OutputItem = OutputMessage | FunctionCall
Item = InputItem | OutputItem


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    """Usage: ``cached_tokens`` served from the cache, ``cache_write_tokens`` newly stored."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Reasoning(TypedDict):
    effort: None
    summary: None


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens"]


class ResponseError(TypedDict):
    code: str
    message: str


class ResponseObject(TypedDict):
    """The response object: all but ``completed_at`` from the start (``status`` in progress,
    ``usage`` null); ``completed_at`` is added when it ends. ``text``, ``tool_choice`` and
    ``tools`` echo the request's JSON."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: Reasoning
    store: bool
    temperature: float
    text: Any
    tool_choice: Any
    tools: list[Any]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]
    completed_at: NotRequired[int]


class ItemPlace(TypedDict):
    """Where a streamed event's item is: its id and its index in ``output``."""

    item_id: str
    output_index: int
