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
from collections.abc import Coroutine
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from proxy.gemini.protocol import model_name
from proxy.http.errors import OpenAIError
from proxy.router.named import holder, named_in
from proxy.router.policy import Decision, Endpoint
from proxy.router.relay import Sent, relay, whole
from proxy.router.replicas import Replica
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
    """Route and forward a request with a prompt (``raw``: its JSON body); a client that leaves
    before the answer is whole cancels it upstream (``while_connected``). A request naming a
    named cache goes to the replica holding it (``proxy.router.named.holder``); a Responses
    request continuing a stored response to the replica that answered that one, and a request
    with OpenAI's ``prompt_cache_key`` to the replica that answered the tenant's last one with
    that key, when it is up and the load allows (``Router.choose``'s ``prefer``).

    Raises:
        OpenAIError: 400 for a body that is not a JSON object; 503 when no replica is up (or
            the one holding the named cache is not).
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # NOTE: JSON nested past Python's parser is not JSON to us
        raise OpenAIError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    if not isinstance(body.get("model", ""), str):
        raise OpenAIError(400, "model: must be a string", param="model")
    model = _model(kind, request, body)
    # NOTE: Gemini's path says whether it streams (its bodies have no such field)
    gemini = kind in ("gemini", "cached_contents")
    stream = request.url.path.endswith(":streamGenerateContent") if gemini else body.get("stream") is True
    options = body.get("stream_options") or {}
    # NOTE: stream_options that are not an object pass through for the replica to refuse; the
    # Responses, Messages and Gemini streams always carry their usage.
    wants_usage = kind not in ("chat", "completions") or not stream or not isinstance(options, dict)
    wants_usage = wants_usage or bool(options.get("include_usage"))
    if not wants_usage:
        raw = json.dumps(body | {"stream_options": options | {"include_usage": True}}).encode()
    key = await asyncio.to_thread(router.identity.prompt, kind, body, tenant, model)
    named = named_in(kind, body)
    holding = await holder(router, request, tenant, named) if named is not None else None
    exclude = {r.url for r in router.replicas.all} - {holding} if holding is not None else set()
    previous = body.get("previous_response_id") if kind == "responses" else None
    prefer = await router.response_replica(tenant, previous) if isinstance(previous, str) else holding
    cache_key = body.get("prompt_cache_key") if kind in ("chat", "completions", "responses") else None
    cache_key = cache_key if isinstance(cache_key, str) and cache_key else None
    if prefer is None and cache_key is not None:
        prefer = await router.key_replica(tenant, cache_key)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
    headers["accept-encoding"] = "identity"  # SSE bytes pass through as they are
    tried: set[str] = set()
    while True:
        choice = await router.choose(kind, key, model, tried | exclude, prefer)
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
            upstream = replica.client.build_request(
                "POST",
                replica.root + request.url.path,
                params=request.query_params,
                content=raw,
                headers=headers,
            )
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
        others = router.replicas.candidates(model, tried | exclude | {replica.url})
        if response.status_code in RETRY_STATUS and not tried and others:
            await response.aclose()
            _failed(router, replica, f"status_{response.status_code}")
            tried.add(replica.url)
            continue
        router.metrics.sent(replica.url, decision, choice.predicted_tokens)
        extra = {"x-kvproxy-replica": replica.url, "x-kvproxy-route": decision}
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in NOT_FORWARDED} | extra
        knows_prompt = previous is None and named is None  # NOTE: else only the replica knows its start
        sent = Sent(router, replica, kind, body, key, tenant, knows_prompt)
        if response.status_code == 200 and sent.knows_prompt:
            router.spawn(router.record(replica, key, key.hashes))
        if response.status_code == 200 and cache_key is not None:
            router.spawn(router.remember_key(tenant, cache_key, replica))
        if stream and response.status_code == 200:
            return StreamingResponse(relay(sent, response, wants_usage), status_code=200, headers=out_headers)
        return await whole(sent, response, out_headers)


def _model(kind: Endpoint, request: Request, body: dict[str, Any]) -> str | None:
    """The model a request asks for: the body's, or on Gemini's routes the path's (``models/x``
    named ``x``, as the replicas serve it)."""
    if kind == "gemini":
        return model_name(str(request.path_params.get("model", "")))
    model = body.get("model")
    return model_name(model) if kind == "cached_contents" and isinstance(model, str) else model


async def pass_through(
    router: Router, request: Request, prefer: str | None = None, model: str | None = None
) -> Response:
    """Send a request without a prompt to route on (a stored response, a named cache, token
    counts, tokenize) to ``prefer`` when it is up, else to the least loaded replica serving
    ``model`` (by default the body's); answered whole, with the upstream's status. One retry on
    another replica when the first cannot be reached.

    Raises:
        OpenAIError: 503 when no replica is up; 502 when the retry fails too.
    """
    raw = await request.body()
    if model is None:
        try:
            model = json.loads(raw).get("model") if raw else None
        except (ValueError, AttributeError):
            model = None  # NOTE: the replica answers a bad body in its own words
    headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
    tried: set[str] = set()
    while True:
        candidates = router.replicas.candidates(model if isinstance(model, str) else None, tried)
        if not candidates:
            raise OpenAIError(503, "no replica is available", type="server_error", code="no_replica")
        loads = router.replicas.inflight
        replica = next(
            (r for r in candidates if r.url == prefer), min(candidates, key=lambda r: loads[r.url])
        )
        decision: Decision = "retry" if tried else "affinity" if replica.url == prefer else "least_loaded"
        router.started(replica)
        try:
            response = await replica.client.request(
                request.method,
                replica.root + request.url.path,
                params=request.query_params,
                content=raw,
                headers=headers,
                timeout=router.settings.first_byte_timeout,
            )
        except httpx.HTTPError:
            _failed(router, replica, "connect")
            if tried:
                raise OpenAIError(
                    502,
                    f"replica {replica.url} did not answer",
                    type="server_error",
                    code="upstream_unavailable",
                ) from None
            tried.add(replica.url)
            continue
        router.ended(replica)
        out = {k: v for k, v in response.headers.items() if k.lower() not in NOT_FORWARDED}
        return Response(
            response.content,
            status_code=response.status_code,
            headers=out | {"x-kvproxy-replica": replica.url, "x-kvproxy-route": decision},
        )


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


def _failed(router: Router, replica: Replica, kind: str) -> None:
    """The request to ``replica`` failed before its first byte: it ends, and the replica waits."""
    router.ended(replica)
    router.metrics.failed(replica.url, kind)
    router.replicas.failed(replica, kind)
