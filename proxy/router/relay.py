"""A replica's answer on its way back to the client: a whole body read and passed on, or SSE
events passed through as they arrive. What the router learns from it on the way: the reply's
text (the next turn's prefix, recorded for the replica), the usage it reports (predicted against
reported cached tokens), and a Responses answer's id (its continuations go to this replica)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.responses import Response

from proxy.http.errors import OpenAIError
from proxy.router.identity import PromptKey
from proxy.router.policy import Endpoint
from proxy.router.replicas import Replica
from proxy.router.replies import ChatUsage, delta_text, reply_text, reply_usage, response_id, sse_data
from proxy.router.routing import Router


@dataclass(frozen=True)
class Sent:
    """A request sent to ``replica``: its route, body, key, the route tenant, and whether its
    reply extends the prompt the router knows (not for a continuation of a stored response,
    whose prompt only the replica knows)."""

    router: Router
    replica: Replica
    kind: Endpoint
    body: dict[str, Any]
    key: PromptKey
    tenant: str
    knows_prompt: bool = True

    def learn(self, reply: str | None, usage: ChatUsage | None, answer_id: str | None) -> None:
        """Record what the answer said (in the background: it outlives the request)."""
        router, replica = self.router, self.replica
        if usage is not None:
            router.metrics.usage(replica.url, usage)
        if reply is not None and self.knows_prompt:
            hashes = router.identity.reply_hashes(self.kind, self.body, self.key, reply)
            router.spawn(router.record(replica, self.key, hashes))
        if answer_id is not None:
            router.spawn(router.remember_response(self.tenant, answer_id, replica))


async def whole(sent: Sent, response: httpx.Response, headers: dict[str, str]) -> Response:
    """A non-streamed answer, read whole, then passed on with the upstream's status."""
    router, replica = sent.router, sent.replica
    try:
        content = await response.aread()
    except httpx.HTTPError:
        router.metrics.failed(replica.url, "mid_response")
        raise OpenAIError(
            502,
            f"replica {replica.url} failed mid-response",
            type="server_error",
            code="upstream_disconnected",
        ) from None
    finally:
        router.ended(replica)  # NOTE: first, and without awaiting: a cancelled request still counts
        router.spawn(response.aclose())
    if response.status_code == 200:
        try:
            doc = json.loads(content)
            sent.learn(reply_text(sent.kind, doc), reply_usage(sent.kind, doc), response_id(doc))
        except (ValueError, AttributeError, TypeError):
            pass
    return Response(content, status_code=response.status_code, headers=headers)


async def relay(sent: Sent, response: httpx.Response, wants_usage: bool) -> AsyncIterator[bytes]:
    """Pass SSE events through as they arrive, collecting the reply, the usage and the id; a
    chat or completions usage chunk the client did not ask for is left out."""
    router, replica, kind = sent.router, sent.replica, sent.kind
    parts: list[str] = []
    usage: ChatUsage | None = None
    answer_id: str | None = None
    buffer = b""
    try:
        async for chunk in response.aiter_raw():
            buffer += chunk.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                doc = sse_data(event)
                if doc is not None:
                    parts.append(delta_text(kind, doc))
                    usage = reply_usage(kind, doc) or usage
                    answer_id = answer_id or response_id(doc)
                    if not wants_usage and "usage" in doc:
                        if not doc.get("choices"):
                            continue  # the usage chunk the client did not ask for
                        event = (
                            b"data: " + json.dumps({k: v for k, v in doc.items() if k != "usage"}).encode()
                        )
                yield event + b"\n\n"
        if buffer.strip():
            yield buffer
    except httpx.HTTPError:
        router.metrics.failed(replica.url, "mid_stream")
        error = {
            "error": {
                "message": f"replica {replica.url} failed mid-stream",
                "type": "server_error",
                "code": "upstream_disconnected",
            }
        }
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
        return
    finally:
        router.ended(replica)  # NOTE: the client may have left: no await may come before this
        router.spawn(response.aclose())
    sent.learn("".join(parts), usage, answer_id)
