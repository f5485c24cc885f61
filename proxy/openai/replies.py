"""The JSON kvproxy writes for the OpenAI routes: a chat completion and its chunks, a (legacy)
completion, their choices, log-probabilities and usage, and a model object.

Each shape is declared once here; the routes build plain dicts of these shapes, so the keys are
written in the order each builder lists them. Source: the OpenAI API reference (Chat
Completions, the chat completion chunk, Completions, Models); ``token_ids`` and
``max_model_len``/``root`` are vLLM's extensions.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from proxy.tools.spec import OpenAICall


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class CompletionUsage(TypedDict):
    """``usage``: ``prompt_tokens_details.cached_tokens`` is 0 on a miss, never null."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(TypedDict):
    """One token of chat ``logprobs.content[]``: its text, log-probability and own bytes."""

    token: str
    logprob: float
    bytes: list[int]


class LogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[LogprobEntry]


class CompletionLogprobs(TypedDict):
    """Legacy completions ``logprobs``: per token its text, log-probability, alternatives
    (text -> log-probability) and where its text starts in the returned text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class FunctionDelta(TypedDict):
    name: NotRequired[str]
    arguments: str


class CallDelta(TypedDict):
    """A streamed tool call: its ``id``, ``type`` and name in its first piece, then arguments."""

    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: FunctionDelta


class ChunkDelta(TypedDict, total=False):
    """A chunk's ``delta``: text, tool calls, and the role in the first chunk."""

    content: str
    tool_calls: list[CallDelta]
    role: Literal["assistant"]


class ReplyMessage(TypedDict):
    """The assistant's message of a chat completion (``content`` null beside calls)."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[OpenAICall]]


class ChatChoice(TypedDict):
    index: int
    message: ReplyMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    token_ids: NotRequired[list[int]]


class ChunkChoice(TypedDict):
    index: int
    delta: ChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    token_ids: NotRequired[list[int]]


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage


class ChatCompletionChunk(TypedDict):
    """One streamed chunk; the usage chunk (``stream_options.include_usage``) has no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: NotRequired[CompletionUsage]


class TextChoice(TypedDict):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    token_ids: NotRequired[list[int]]


class TextCompletion(TypedDict):
    """A completion, or one chunk of a streamed one (the same object)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: NotRequired[CompletionUsage]


Chunk = ChatCompletionChunk | TextCompletion
"""One chunk of either streamed completion."""


class ModelCard(TypedDict):
    """OpenAI's model object, with vLLM's ``root`` and ``max_model_len``."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int
