"""OpenAI request models (the fields kvproxy reads) and response shapes.

Source: the OpenAI API reference for Chat Completions and (legacy) Completions. Unknown fields
are accepted and ignored, as chat apps send many.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from proxy.openai.replies import CompletionUsage
from proxy.tools.rendering import TemplateMessage

# NOTE: strict numbers and booleans: "5" is not a max_tokens and "yes" is not a stream.
Count = Annotated[StrictInt, Field(ge=1)]
Real = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None

    def for_template(self) -> TemplateMessage:
        """The message as chat templates take it: role, text and the tool fields that are set."""
        out: TemplateMessage = {"role": self.template_role(), "content": self.text()}
        for field in ("name", "tool_calls", "tool_call_id", "function_call"):
            if getattr(self, field) is not None:
                out[field] = getattr(self, field)
        return out

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""

    def template_role(self) -> str:
        """The role as chat templates know it: ``developer`` is OpenAI's newer name for ``system``."""
        return "system" if self.role == "developer" else self.role

    def unsupported(self) -> str | None:
        """The first content part kvproxy cannot serve (images, audio, files), if any."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if part.type != "text"), None)
        return None


def unsupported_content(messages: list[ChatMessage]) -> tuple[str, str] | None:
    """``(param, reason)`` for the first message whose content parts are not all text."""
    for i, message in enumerate(messages):
        if (kind := message.unsupported()) is not None:
            return f"messages[{i}].content", f"content parts of type `{kind}` are not supported; send text"
    return None


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingFields(_Lenient):
    """Fields chat and completions requests share."""

    model: str
    max_tokens: Count | None = None
    temperature: Real | None = Field(None, ge=0, le=2)
    top_p: Real | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None  # NOTE: at most 4 strings
    presence_penalty: Real | None = Field(None, ge=-2, le=2)
    frequency_penalty: Real | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Annotated[Real, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(
        None, description="How long cached prefix blocks are kept: the server TTL, or 24 h (capped)."
    )
    return_token_ids: bool = Field(
        False, description="Extension (as in vLLM): each choice also carries its `token_ids`."
    )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field this server cannot honour, if any."""
        if self.n != 1:
            return "n", "only n=1 is supported; send one request per choice"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ResponseFormat(_Lenient):
    type: str
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)

    def template_messages(self) -> list[TemplateMessage]:
        return [m.for_template() for m in self.messages]

    max_completion_tokens: Count | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Data for the chat template (``proxy.tools.rendering.template_data``)."
    )

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field this server cannot honour, if any."""
        if (common := super().unsupported_field()) is not None:
            return common
        for name in ("functions", "function_call", "audio"):
            if getattr(self, name, None):  # extra fields land as attributes
                hint = "; send `tools`" if name.startswith("function") else ""
                return name, f"`{name}` is not supported by this server{hint}"
        if self.model_extra and self.model_extra.get("modalities") not in (None, ["text"]):
            return "modalities", "only text output is supported"
        return unsupported_content(self.messages)


class CompletionRequest(SamplingFields):
    prompt: str | list[StrictInt]
    max_tokens: Count | None = 16
    logprobs: StrictInt | None = Field(None, ge=0, le=5)
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = Field(None, ge=1)

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field this server cannot honour, if any."""
        if (common := super().unsupported_field()) is not None:
            return common
        if self.suffix:
            return "suffix", "`suffix` (insertion) is not supported by this server"
        if self.best_of is not None and self.best_of > 1:
            return "best_of", "`best_of` > 1 is not supported by this server"
        if self.echo and self.logprobs is not None:
            return (
                "echo",
                "`echo` with `logprobs` is not supported (prompt log-probabilities are not computed)",
            )
        return None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> CompletionUsage:
    """OpenAI usage with ``prompt_tokens_details.cached_tokens`` (0 on a miss, never null)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
