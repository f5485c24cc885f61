"""The JSON objects kvproxy's Gemini routes answer (``v1beta``), key for key in the order they
are written: ``GenerateContentResponse`` (a stream's chunk too), ``Model``, ``CachedContent``
and their listings.

Source: Google's Gemini API reference (``models``, ``cachedContents``); ``cachedBlockTokens``
and ``cachedBlockBytes`` are kvproxy's, beside the count Gemini gives.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class TextPart(TypedDict):
    """A ``Part`` holding text (the only kind kvproxy writes)."""

    text: str


class ModelContent(TypedDict):
    """A ``Content`` the model wrote."""

    role: Literal["model"]
    parts: list[TextPart]


class Candidate(TypedDict):
    """A ``Candidate``; ``finishReason`` only once the turn has finished."""

    content: ModelContent
    index: int
    finishReason: NotRequired[str]


class UsageMetadata(TypedDict):
    """A ``GenerateContentResponse``'s ``usageMetadata``: ``cachedContentTokenCount`` of the
    prompt's tokens were read from cached blocks."""

    promptTokenCount: int
    cachedContentTokenCount: int
    candidatesTokenCount: int
    totalTokenCount: int


class GenerateContentResponse(TypedDict):
    """A ``GenerateContentResponse`` with its candidates, counts, model and id."""

    candidates: list[Candidate]
    usageMetadata: UsageMetadata
    modelVersion: str
    responseId: str


class ModelResource(TypedDict):
    """A ``Model``: the served model under one of its names, token limits in tokens."""

    name: str
    baseModelId: str
    displayName: str
    inputTokenLimit: int
    outputTokenLimit: int
    supportedGenerationMethods: list[str]


class ModelList(TypedDict):
    """``models.list``'s answer: a page, and the token of the next one if any."""

    models: list[ModelResource]
    nextPageToken: NotRequired[str]


class TokenCount(TypedDict):
    """``models.countTokens``'s answer: the prompt's length in tokens."""

    totalTokens: int


class CacheUsage(TypedDict):
    """A ``CachedContent``'s ``usageMetadata``: its tokens, those in whole blocks, and the bytes
    those blocks hold."""

    totalTokenCount: int
    cachedBlockTokens: int
    cachedBlockBytes: int


class CachedContent(TypedDict):
    """A ``CachedContent`` without its contents (as Gemini answers it); times in RFC 3339."""

    name: str
    model: str
    displayName: str
    createTime: str
    updateTime: str
    expireTime: str
    usageMetadata: CacheUsage


class CachedContentList(TypedDict):
    """``cachedContents.list``'s answer: a page, and the token of the next one if any."""

    cachedContents: list[CachedContent]
    nextPageToken: NotRequired[str]
