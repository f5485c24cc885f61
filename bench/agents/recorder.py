"""A recording pass-through proxy: the agents talk to it, it forwards every request unchanged to
the server under test and notes, per request, what came back (status, prompt and cached tokens,
tool calls, the server's error text and the body it refused).

It asks the server to explain each cache outcome (``x-kvproxy-explain: 1``, which kvproxy answers
with a header on a stream and a body field otherwise; the field is taken out before the client
sees the body) so a table row can say why a prompt missed; any other server ignores the header.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bench.agents.usage import SseReader, Usage

EXPLAIN_HEADER = "x-kvproxy-explain"
EXPLANATION_FIELD = "kvproxy_cache_explanation"
# NOTE: hop-by-hop headers, and those a re-framed body invalidates
_DROPPED = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "content-encoding",
        "accept-encoding",
    }
)
MODEL_PATHS = ("/messages", "/responses", "/chat/completions", "/completions")


@dataclass
class Exchange:
    """One request the agent sent and what the server answered."""

    label: str
    method: str
    path: str
    status: int = 0
    seconds: float = 0.0
    usage: Usage = field(default_factory=Usage)
    explanation: dict[str, Any] | None = None
    body: bytes = b""
    answer: bytes = b""

    @property
    def is_model_call(self) -> bool:
        """A request that runs the model (not a model listing, a token count, a health probe)."""
        return self.method == "POST" and self.path.rstrip("/").endswith(MODEL_PATHS)

    @property
    def error_text(self) -> str:
        """The server's error message of a refused request, else ``""``."""
        if self.status < 400:
            return "; ".join(self.usage.errors)
        try:
            error = json.loads(self.answer).get("error")
            return str(error.get("message") if isinstance(error, dict) else error)
        except (ValueError, AttributeError):
            return self.answer[:500].decode("utf-8", "replace")


class Recorder:
    """Forwards everything under its own base URL to ``upstream`` (the server's root URL, no
    ``/v1``); ``label`` names the exchanges recorded from now on; each model call, once answered,
    is appended to ``log`` (JSON lines) when given, to follow a long run."""

    def __init__(self, upstream: str, explain: bool = True, log: Path | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.explain = explain
        self.log = log
        self.label = ""
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The root URL agents are pointed at (append ``/v1`` where a client wants it)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Recorder:
        """Listen on a free loopback port, in a thread of its own, once it accepts connections."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "DELETE", "PUT"])]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="agents-recorder", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the recording proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop listening (requests in flight end with it)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def of(self, label: str) -> list[Exchange]:
        """The model calls recorded under ``label``, in the order they were sent."""
        with self._lock:
            return [e for e in self.exchanges if e.label == label and e.is_model_call]

    async def _forward(self, request: Request) -> Response:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=httpx.Timeout(None))
        body = await request.body()
        exchange = Exchange(self.label, request.method, request.url.path, body=body)
        with self._lock:
            self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        headers["accept-encoding"] = "identity"
        if self.explain:
            headers[EXPLAIN_HEADER] = "1"
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        started = time.monotonic()
        upstream = await self._client.send(
            self._client.build_request(request.method, path, headers=headers, content=body), stream=True
        )
        exchange.status = upstream.status_code
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED}
        if EXPLAIN_HEADER in upstream.headers:
            exchange.explanation = _json(upstream.headers[EXPLAIN_HEADER])
            out_headers.pop(EXPLAIN_HEADER, None)
        if "text/event-stream" in upstream.headers.get("content-type", ""):
            reader = SseReader(exchange.usage)

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.aiter_raw():
                        reader.feed(chunk)
                        yield chunk
                finally:
                    exchange.seconds = time.monotonic() - started
                    self._logged(exchange)

            return StreamingResponse(
                relay(),
                status_code=upstream.status_code,
                headers=out_headers,
                background=BackgroundTask(upstream.aclose),
            )
        answer = await upstream.aread()
        await upstream.aclose()
        exchange.seconds = time.monotonic() - started
        exchange.answer = answer
        document = _json(answer)
        if isinstance(document, dict):
            exchange.usage.read(document)
            if EXPLANATION_FIELD in document:
                exchange.explanation = document.pop(EXPLANATION_FIELD)
                answer = json.dumps(document).encode()
        self._logged(exchange)
        return Response(answer, status_code=upstream.status_code, headers=out_headers)

    def _logged(self, exchange: Exchange) -> None:
        if self.log is None or not exchange.is_model_call:
            return
        line = {
            "label": exchange.label,
            "path": exchange.path,
            "status": exchange.status,
            "prompt": exchange.usage.prompt,
            "cached": exchange.usage.cached,
            "tool_calls": exchange.usage.tool_calls,
            "ended": exchange.usage.ended,
            "seconds": round(exchange.seconds, 2),
            "error": exchange.error_text or None,
            "explanation": exchange.explanation,
        }
        with self.log.open("a") as out:
            out.write(json.dumps(line) + "\n")


def _json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
