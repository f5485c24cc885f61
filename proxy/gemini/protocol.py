"""Gemini API bodies (``v1beta``): contents, generation config, cached contents, and the replies
kvproxy gives. Fields are camelCase on the wire (the ``google-genai`` SDK's JSON); snake_case is
accepted too. Text parts only.

Source: Google's Gemini API reference: ``models.generateContent``, ``models.streamGenerateContent``
and ``cachedContents`` (Content, Part, GenerationConfig, CachedContent, UsageMetadata; Duration
and Timestamp in protobuf's JSON form: ``"600s"``, RFC 3339).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from proxy.http.errors import OpenAIError
from proxy.http.numbers import is_count
from proxy.tools.rendering import TemplateMessage

PROTO_NUMBER = re.compile(r"-?([0-9]{1,18}(\.[0-9]{0,18})?|\.[0-9]{1,18})([eE][-+]?[0-9]{1,3})?")
"""A float as protobuf's JSON may write it as text (a sign, digits, a fraction, an exponent)."""
DURATION = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?s")
"""A ``ttl`` (protobuf's ``Duration`` in JSON: ``"600s"``, ``"1.5s"``)."""
ROLES = {"user": "user", "model": "assistant"}
"""Gemini's content roles as chat roles."""


def _proto_int(value: Any) -> Any:
    """An int32 as protobuf's JSON writes it: a number, or a string of ASCII digits (an optional
    ``-``), never ``"²"``, ``"1_000"`` or thousands of digits (``proxy.http.numbers``), never a
    boolean."""
    if isinstance(value, str) and not is_count(value.removeprefix("-")):
        raise ValueError("an integer in ASCII digits")
    return _proto_number(value)


def _proto_number(value: Any) -> Any:
    """A number as protobuf's JSON writes it: a number, or its text in ASCII (``"0.5"``,
    ``"-1e-3"``), never ``true`` or ``false`` (which pydantic would read as 1 and 0) nor text
    pydantic reads loosely (``" 1"``, ``"+1"``, ``"1_0"`` as 10)."""
    if isinstance(value, bool):
        raise ValueError("a number, not a boolean")
    if isinstance(value, str) and not PROTO_NUMBER.fullmatch(value):
        raise ValueError("a number in ASCII digits")
    return value


Int32 = Annotated[int, BeforeValidator(_proto_int), Field(ge=-(2**31), le=2**31 - 1)]
"""Gemini's int32 fields (``maxOutputTokens``, ``seed``)."""
Float = Annotated[float, BeforeValidator(_proto_number), Field(allow_inf_nan=False)]
"""Gemini's float fields (``temperature``, ``topP``, penalties)."""


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class Part(_Body):
    text: str | None = None


class Content(_Body):
    role: Literal["user", "model"] | None = None
    parts: list[Part] = Field(default_factory=list)

    def text(self, param: str) -> str:
        """The parts' text, joined.

        Raises:
            OpenAIError: 400 naming the first part that is not text.
        """
        for i, part in enumerate(self.parts):
            if part.text is None or part.model_extra:
                kind = next(iter(part.model_extra or {}), "empty part")
                raise OpenAIError(
                    400, f"only text parts are supported, not {kind}", param=f"{param}.parts[{i}]"
                )
        return "".join(p.text or "" for p in self.parts)


def chat_messages(
    system: Content | None, contents: list[Content], param: str = "contents"
) -> list[TemplateMessage]:
    """A system instruction and contents as chat messages (``role`` ``user`` when absent).

    Raises:
        OpenAIError: 400 naming a part that is not text.
    """
    out = [] if system is None else [{"role": "system", "content": system.text("systemInstruction")}]
    for i, content in enumerate(contents):
        out.append({"role": ROLES[content.role or "user"], "content": content.text(f"{param}[{i}]")})
    return out


class GenerationConfig(_Body):
    max_output_tokens: Int32 | None = Field(None, ge=1)
    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    stop_sequences: list[str] | None = Field(None, max_length=5)
    candidate_count: Int32 | None = Field(None, ge=1, le=1)
    seed: Int32 | None = None
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    response_mime_type: Literal["text/plain"] | None = None


UNSUPPORTED = {
    "tools": "tools",
    "toolConfig": "tools",
    "generationConfig.responseSchema": "structured output",
    "generationConfig.responseJsonSchema": "structured output",
    "generationConfig.topK": "top-k sampling",
    "generationConfig.responseLogprobs": "log-probabilities",
    "generationConfig.thinkingConfig": "thinking",
    "generationConfig.responseModalities": "other modalities",
}
"""Gemini fields kvproxy cannot honour on these routes (refused by name; others unknown are
ignored, as ``safetySettings``)."""


def unsupported(body: _Body, prefix: str = "") -> str | None:
    """The first field of ``UNSUPPORTED`` that ``body`` (or its ``generationConfig``) sets."""
    for name, value in (body.model_extra or {}).items():
        field = prefix + to_camel(name)
        if value is not None and field in UNSUPPORTED:
            return field
    config = getattr(body, "generation_config", None)
    return unsupported(config, "generationConfig.") if config is not None else None


def refuse_unsupported(body: _Body) -> None:
    """Raises OpenAIError: 400 naming a field of ``UNSUPPORTED`` the body sets."""
    if (field := unsupported(body)) is not None:
        raise OpenAIError(
            400, f"`{field}` ({UNSUPPORTED[field]}) is not supported on this route", param=field
        )


class GenerateContentRequest(_Body):
    contents: list[Content] = Field(default_factory=list)
    system_instruction: Content | None = None
    generation_config: GenerationConfig = Field(default_factory=GenerationConfig)
    cached_content: str | None = None


class CachedContentRequest(_Body):
    """``cachedContents.create``'s body (and ``patch``'s: ``ttl`` or ``expireTime`` only)."""

    model: str | None = None
    contents: list[Content] = Field(default_factory=list)
    system_instruction: Content | None = None
    display_name: str = Field("", max_length=128)
    ttl: str | None = None
    expire_time: datetime | None = None

    @field_validator("ttl")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        # NOTE: protobuf's Duration in JSON: ASCII digits, at most 12 of seconds (its range,
        # 315,576,000,000 s) and 9 of fractions; ``\d`` would take any script's digits
        if value is not None and not DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a duration such as '600s'")
        return value

    def expiry(self, now: float, default_s: int, longest_s: int) -> float:
        """The expiry (Unix seconds) asked for: ``expireTime``, else now + ``ttl`` (default
        ``default_s``), at most ``longest_s`` from now.

        Raises:
            OpenAIError: 400 for both given, or an expiry not in the future.
        """
        if self.ttl is not None and self.expire_time is not None:
            raise OpenAIError(400, "give ttl or expireTime, not both", param="ttl")
        if self.expire_time is not None:
            stamp = self.expire_time
            at = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
        else:
            at = now + (float(self.ttl[:-1]) if self.ttl is not None else default_s)
        if at <= now:
            raise OpenAIError(400, "the expiry must be in the future", param="expireTime")
        return min(at, now + longest_s)


def timestamp(unix_s: float) -> str:
    """Unix seconds as an RFC 3339 timestamp in UTC (``2026-12-03T14:00:00.000000Z``)."""
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def model_name(name: str) -> str:
    """A model as the API names it (``models/x``, or ``x``) as kvproxy serves it: ``x``."""
    return name.removeprefix("models/")
