"""Forwarding one request to the chosen replica, and what happens when that fails.

The body passes through untouched (fields the local engine refuses, such as tools, ``n`` or JSON
mode, work whenever the upstream supports them), except that a stream is asked for its usage
(``stream_options.include_usage``) so the router can compare the cached tokens it predicted with
those reported; the usage is removed again if the client did not ask. Streams pass through as
they arrive; the upstream's status and error bodies reach the client unchanged.

Failures: a connection error, a timeout before the first byte, or 429/502/503 open that
replica's breaker and the request is retried once on the next choice. After the first byte has
been sent, a failure ends the stream with an SSE ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from proxy.http.errors import OpenAIError
from proxy.router.identity import PromptKey
from proxy.router.policy import Decision, Endpoint
from proxy.router.replicas import Replica
from proxy.router.replies import delta_text, reply_text, sse_data
from proxy.router.routing import Router

DISCONNECT_POLL_S = 0.1
CLIENT_CLOSED = 499
"""The status logged for a request whose client left (nobody receives it)."""

NOT_FORWARDED = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "accept-encoding",
    "content-encoding",
    "date",
    "server",
}
RETRY_STATUS = {429, 502, 503}
ROUTE_HEADERS = ("x-kvproxy-replica", "x-kvproxy-route")


async def forward(router: Router, request: Request, kind: Endpoint, raw: bytes, tenant: str) -> Response:
    """Route and forward a ``chat`` or ``completions`` request (``raw``: its JSON body); a client
    that leaves before the answer is whole cancels it upstream (``while_connected``).

    Raises:
        OpenAIError: 400 for a body that is not a JSON object; 503 when no replica is up.
    """
    try:
        body = json.loads(raw)
    except ValueError:
        raise OpenAIError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    if not isinstance(body.get("model", ""), str):
        raise OpenAIError(400, "model: must be a string", param="model")
    stream = body.get("stream") is True
    options = body.get("stream_options") or {}
    # NOTE: stream_options that are not an object pass through for the replica to refuse.
    wants_usage = not stream or not isinstance(options, dict) or bool(options.get("include_usage"))
    if not wants_usage:
        raw = json.dumps(body | {"stream_options": options | {"include_usage": True}}).encode()
    key = await asyncio.to_thread(router.identity.prompt, kind, body, tenant)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
    headers["accept-encoding"] = "identity"  # SSE bytes pass through as they are
    path = request.url.path.removeprefix("/v1")
    tried: set[str] = set()
    while True:
        choice = await router.choose(kind, key, body.get("model"), tried)
        if choice is None:
            raise OpenAIError(
                503,
                "no replica is available",
                type="server_error",
                code="no_replica",
                headers={"Retry-After": "1"},
            )
        replica = router.replicas.get(choice.replica)
        decision: Decision = "retry" if tried else choice.decision
        router.started(replica)
        try:
            upstream = replica.client.build_request("POST", replica.url + path, content=raw, headers=headers)
            response = await asyncio.wait_for(
                replica.client.send(upstream, stream=True), router.settings.first_byte_timeout
            )
        except asyncio.CancelledError:
            router.ended(replica)  # NOTE: the client left while the replica had not answered yet
            raise
        except (httpx.HTTPError, TimeoutError) as exc:
            failure = "timeout" if isinstance(exc, TimeoutError | httpx.TimeoutException) else "connect"
            _failed(router, replica, failure)
            if tried:
                message = f"replica {replica.url} did not answer ({failure})"
                raise OpenAIError(502, message, type="server_error", code="upstream_unavailable") from None
            tried.add(replica.url)
            continue
        others = router.replicas.candidates(body.get("model"), tried | {replica.url})
        if response.status_code in RETRY_STATUS and not tried and others:
            await response.aclose()
            _failed(router, replica, f"status_{response.status_code}")
            tried.add(replica.url)
            continue
        router.metrics.sent(replica.url, decision, choice.predicted_tokens)
        extra = {"x-kvproxy-replica": replica.url, "x-kvproxy-route": decision}
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in NOT_FORWARDED} | extra
        if response.status_code == 200:
            router.spawn(router.record(replica, key, key.hashes))
        if stream and response.status_code == 200:
            events = _relay(router, replica, response, kind, body, key, wants_usage)
            return StreamingResponse(events, status_code=200, headers=out_headers)
        return await _whole(router, replica, response, kind, body, key, out_headers)


async def while_connected(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """``work``, cancelled once the client disconnects (checked every ``DISCONNECT_POLL_S``
    seconds): the connection to the replica is then closed, and a replica stops generating, as
    it does for a client of its own. Streams stop the same way when their client leaves."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=CLIENT_CLOSED)
    return task.result()


async def _whole(
    router: Router,
    replica: Replica,
    response: httpx.Response,
    kind: Endpoint,
    body: dict[str, Any],
    key: PromptKey,
    headers: dict[str, str],
) -> Response:
    """A non-streamed answer, read whole, then passed on with the upstream's status."""
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
            reply = reply_text(kind, doc)
            router.metrics.usage(replica.url, doc.get("usage") or {})
        except (ValueError, AttributeError, TypeError):
            reply = None
        if reply is not None:
            router.spawn(router.record(replica, key, router.identity.reply_hashes(kind, body, key, reply)))
    return Response(content, status_code=response.status_code, headers=headers)


async def _relay(
    router: Router,
    replica: Replica,
    response: httpx.Response,
    kind: Endpoint,
    body: dict[str, Any],
    key: PromptKey,
    wants_usage: bool,
) -> AsyncIterator[bytes]:
    """Pass SSE events through as they arrive, collecting the reply and the usage."""
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    buffer = b""
    try:
        async for chunk in response.aiter_raw():
            buffer += chunk.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                doc = sse_data(event)
                if doc is not None:
                    parts.append(delta_text(kind, doc))
                    usage = doc.get("usage") or usage
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
    if usage is not None:
        router.metrics.usage(replica.url, usage)
    reply = "".join(parts)
    router.spawn(router.record(replica, key, router.identity.reply_hashes(kind, body, key, reply)))


def _failed(router: Router, replica: Replica, kind: str) -> None:
    """The request to ``replica`` failed before its first byte: it ends, and the replica waits."""
    router.ended(replica)
    router.metrics.failed(replica.url, kind)
    router.replicas.failed(replica, kind)
