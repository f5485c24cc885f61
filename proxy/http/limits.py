"""Bounds on what one client can hold: the request body's size (413, before parsing) and the time
to send request headers (the connection is closed); ``server_config``, uvicorn's configuration
with them, for both apps."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config import ServerSettings
from proxy.http.errors import OpenAIError, dialect
from proxy.http.redact import log_config


class BodySizeLimit:
    """ASGI middleware: answer 413 for a body over ``max_bytes``, declared or streamed.

    NOTE: the body is read here, up to the limit, and replayed to the app: an error raised while
    the app reads it would reach the client as FastAPI's generic 400 instead. Paths in
    ``streamed`` (snapshot imports, admin only) pass through unread: their route streams the body
    to disk.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, streamed: frozenset[str] = frozenset()) -> None:
        self.app, self.max_bytes, self.streamed = app, max_bytes, streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.streamed:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        # NOTE: more digits than any count this server reads is over any limit (and past int's)
        over = (
            declared is not None
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > self.max_bytes)
        )
        if over:
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending its body
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later calls wait for the client to disconnect

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = OpenAIError(
            413, f"request body is larger than {self.max_bytes} bytes", code="request_too_large"
        )
        await error.response(dialect(scope["path"]))(scope, receive, send)


def header_timeout_protocol(seconds: float) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol, closing a connection whose request is incomplete for too long:
    its request line and headers have not all arrived within ``seconds`` of the connection (or of
    the request's first byte), or its body stalls ``seconds`` between two chunks.

    NOTE: uvicorn times out idle keep-alive connections but not incomplete requests: a client
    that opens connections and trickles headers, sends nothing, or never sends the body it
    announced would hold them forever. A slow but steady upload is never cut.
    """

    class HeaderTimeout(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._arm()  # now for the body's first chunk
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._arm()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout


def server_config(app: ASGIApp, settings: ServerSettings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app``: ``settings``' address, incomplete requests closed
    after ``--header-timeout``, secrets redacted from its access and error logs
    (``proxy.http.redact``); ``options`` override."""
    given: dict[str, Any] = {"log_config": log_config()} | options
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=header_timeout_protocol(settings.header_timeout),
        **given,
    )
