"""What the router reads of a replica's answer: the reply's text (to predict the next turn's
prefix) and the usage, from a JSON body or SSE events, whatever else they hold."""

from __future__ import annotations

import json
from typing import Any

from proxy.router.policy import Endpoint


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
    """The text a streamed chunk adds to choice 0 ("" when none)."""
    for choice in doc.get("choices") or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            text = (choice.get("delta") or {}).get("content") if kind == "chat" else choice.get("text")
            return text if isinstance(text, str) else ""
    return ""


def reply_text(kind: Endpoint, doc: dict[str, Any]) -> str | None:
    """The text of choice 0 of a whole answer (None when it has none)."""
    choice = (doc.get("choices") or [None])[0]
    if not isinstance(choice, dict):
        return None
    text = (choice.get("message") or {}).get("content") if kind == "chat" else choice.get("text")
    return text if isinstance(text, str) else None
