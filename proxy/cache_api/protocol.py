"""The bodies of the cache routes (``/v1/cache/*``), as pydantic models."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from pydantic import BaseModel, Field, StrictInt, model_validator

from proxy.http.auth import DEFAULT_TENANT
from proxy.openai.protocol import ChatMessage


class PrewarmRequest(BaseModel):
    """A prompt to cache: ``messages`` or ``prompt`` (exactly one)."""

    model: str | None = Field(None, description="Checked against the served model when given.")
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt: str | list[StrictInt] | None = None
    add_generation_prompt: bool = Field(
        True, description="Render messages with the assistant's generation prompt, as chat does."
    )
    tools: list[Any] | None = Field(
        None, description="OpenAI function tools of the chat (``messages``), rendered as chat renders them."
    )
    ttl: StrictInt | None = Field(
        None, gt=0, description="Seconds the blocks stay cached after their last hit (capped at --max-ttl)."
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> PrewarmRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of `messages` and `prompt`")
        return self


class ExportRequest(BaseModel):
    """Which blocks to export: those of ``prompts`` (prewarm bodies) or ``all`` of a tenant's."""

    tenant: str = Field(DEFAULT_TENANT, min_length=1, description="Whose cache (a tenant name).")
    prompts: list[PrewarmRequest] | None = Field(None, min_length=1)
    all: bool = False

    @model_validator(mode="after")
    def _one_selection(self) -> ExportRequest:
        if (self.prompts is None) == (not self.all):
            raise ValueError("give either `prompts` or `all: true`")
        return self


class ClearRequest(BaseModel):
    namespace: str | None = Field(None, pattern="^[0-9a-f]{32}$", description="Only this namespace (hex).")


class ProcessCounters(TypedDict):
    """``/v1/cache/stats``' ``process``: this process's engine counters (``EngineStats``'
    fields) and, with a cache, its cache counters (``CacheStats``' fields)."""

    engine: dict[str, int | float]
    cache: NotRequired[dict[str, int]]
