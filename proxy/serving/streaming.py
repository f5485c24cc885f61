"""Response shaping: a finished completion as JSON, a streamed one as server-sent events, both
with the cache headers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping

from fastapi.responses import JSONResponse, StreamingResponse

from proxy.serving.explain import EXPLAIN_HEADER, EXPLANATION_FIELD, explanation_header
from proxy.serving.running import Started


def json_response(started: Started, body: Mapping[str, object]) -> JSONResponse:
    """A finished completion (any JSON object): the cache headers, and the explanation in the
    body (its last field) when asked, with what speculation drafted for the answer and how much of
    it was accepted (tokens; ``engine.drafting``)."""
    if started.explanation is not None:
        explanation = started.explanation.as_json()
        if (finished := started.running.finished) is not None:
            explanation["speculation"] = {
                "draft_tokens": finished.draft_tokens,
                "accepted_tokens": finished.accepted_tokens,
            }
        body = {**body, EXPLANATION_FIELD: explanation}
    return JSONResponse(body, headers=started.headers)


def event_stream(started: Started, events: AsyncIterator[str]) -> StreamingResponse:
    """A streamed completion: the cache headers, and the explanation as a header when asked."""
    headers = started.headers
    if started.explanation is not None:
        headers = headers | {EXPLAIN_HEADER: explanation_header(started.explanation)}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def sse(obj: Mapping[str, object]) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def new_id(prefix: str, sep: str = "-") -> str:
    """A response id: ``chatcmpl-...`` (OpenAI's style) or, with ``sep="_"``, ``msg_...``."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
