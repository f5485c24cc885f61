"""What the router reads of a replica's answer: the reply's text (to predict the next turn's
prefix) and the usage, from a JSON body or SSE events, whatever else they hold."""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

from proxy.router.policy import Endpoint


class PromptDetails(TypedDict, total=False):
    """``usage.prompt_tokens_details``: the prompt tokens read from the replica's cache."""

    cached_tokens: int | None


class ChatUsage(TypedDict, total=False):
    """A reply's usage as chat completions count it (the figures as the replica wrote them, None
    or missing when it wrote none); a chat or completions reply's ``usage`` holds more."""

    prompt_tokens: int | None
    prompt_tokens_details: PromptDetails


def sse_data(event: bytes) -> dict[str, Any] | None:
    """The JSON object of an SSE event's ``data:`` line (None for ``[DONE]``, comments, other)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                doc = json.loads(line[5:].strip())
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def delta_text(kind: Endpoint, doc: dict[str, Any]) -> str:
    """The text a streamed event adds to the reply ("" when none): choice 0's delta, a Responses
    ``response.output_text.delta``, a Messages ``text_delta``, a Gemini chunk's candidate 0."""
    if kind == "gemini":
        return _candidate_text(doc) or ""
    if kind == "responses":
        text = doc.get("delta") if doc.get("type") == "response.output_text.delta" else None
    elif kind == "messages":
        delta = doc.get("delta") if doc.get("type") == "content_block_delta" else None
        text = delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None
    else:
        choice = _choice(doc.get("choices"))
        text = (
            None
            if choice is None
            else (choice.get("delta") or {}).get("content")
            if kind == "chat"
            else choice.get("text")
        )
    return text if isinstance(text, str) else ""


def reply_text(kind: Endpoint, doc: dict[str, Any]) -> str | None:
    """The text of a whole answer (choice 0, the Responses output messages, the Messages text
    blocks, Gemini's candidate 0); None when it has none."""
    if kind == "gemini":
        return _candidate_text(doc)
    if kind == "cached_contents":
        return None  # NOTE: a named cache's description, no reply
    if kind in ("responses", "messages"):
        parts = (
            doc.get("content")
            if kind == "messages"
            else [
                part
                for item in doc.get("output") or []
                if isinstance(item, dict) and item.get("type") == "message"
                for part in item.get("content") or []
            ]
        )
        texts = [
            p.get("text")
            for p in parts or []
            if isinstance(p, dict) and p.get("type") in ("text", "output_text")
        ]
        return "".join(t for t in texts if isinstance(t, str)) if texts else None
    choice = _choice(doc.get("choices"))
    if choice is None:
        return None
    text = (choice.get("message") or {}).get("content") if kind == "chat" else choice.get("text")
    return text if isinstance(text, str) else None


def reply_usage(kind: Endpoint, doc: dict[str, Any]) -> ChatUsage | None:
    """The usage a body or event reports, as chat completions count it (``prompt_tokens``,
    ``prompt_tokens_details.cached_tokens``); None when it reports none. Gemini's
    ``usageMetadata`` (``promptTokenCount``, ``cachedContentTokenCount``) is in every chunk of a
    stream, cumulative."""
    if kind in ("gemini", "cached_contents"):
        meta = doc.get("usageMetadata") if kind == "gemini" else None
        if not isinstance(meta, dict):
            return None
        cached = meta.get("cachedContentTokenCount")
        return {
            "prompt_tokens": meta.get("promptTokenCount"),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    if kind == "responses":
        usage = (doc.get("response") if "response" in doc else doc) or {}
        usage = usage.get("usage") if isinstance(usage, dict) else None
        if not isinstance(usage, dict):
            return None
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        return {
            "prompt_tokens": usage.get("input_tokens"),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    if kind == "messages":
        usage = (
            (doc.get("message") or {}).get("usage")
            if doc.get("type") == "message_start"
            else doc.get("usage")
        )
        if not isinstance(usage, dict) or doc.get("type") == "message_delta":
            return None
        read, created = (
            usage.get("cache_read_input_tokens") or 0,
            usage.get("cache_creation_input_tokens") or 0,
        )
        prompt = (usage.get("input_tokens") or 0) + read + created
        return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": read}}
    reported = doc.get("usage")  # NOTE: chat's and completions' own usage object, passed on as is
    return cast(ChatUsage, reported) if isinstance(reported, dict) else None


def response_id(doc: dict[str, Any]) -> str | None:
    """The id of a Responses answer: a body's, or that of ``response.created``'s response."""
    if doc.get("object") == "response":
        found = doc.get("id")
    elif doc.get("type") == "response.created":
        found = (doc.get("response") or {}).get("id")
    else:
        return None
    return found if isinstance(found, str) else None


def _choice(choices: object) -> dict[str, Any] | None:
    """Choice 0 of a ``choices`` list."""
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _candidate_text(doc: dict[str, Any]) -> str | None:
    """The text parts of a Gemini answer's candidate 0, joined (None: no such candidate)."""
    candidates = doc.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    content = first.get("content") if isinstance(first, dict) else None
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return None
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
