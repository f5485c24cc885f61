"""A small OpenAI-compatible upstream for router tests: a real ASGI app served on 127.0.0.1 that
answers, fails on demand (429, 503, a slow first byte, a stream cut mid-way) and records what it
received."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from proxy.config import Settings


async def left_within(request: Request, seconds: float) -> bool:
    """Whether the client of ``request`` disconnects within ``seconds`` (polled every 50 ms), so
    that a slow answer nobody waits for keeps no server from stopping."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(0.05)
    return False


def fake_upstream(name: str) -> FastAPI:
    """An upstream named ``name``; set ``app.state.mode`` to ``ok``, ``429``, ``503``, ``slow``
    (answers after ``app.state.delay_s``, or never once its client has left: when it noticed is
    appended to ``app.state.left``, ``time.monotonic()``), ``drip`` (streams a chunk every
    ``delay_s``), ``cut`` (a stream dropped after two chunks) or ``down`` (``/health`` answers
    503)."""
    app = FastAPI()
    app.state.settings = Settings()
    app.state.mode, app.state.delay_s, app.state.bodies, app.state.left = "ok", 3.0, [], []

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"}, status_code=503 if app.state.mode == "down" else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}, {"id": f"only-{name}"}]}

    async def answer(request: Request, kind: str) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        app.state.bodies.append((raw, dict(request.headers)))
        mode = app.state.mode
        if mode in ("429", "503"):
            error = {
                "error": {"message": f"{name} says {mode}", "type": "overloaded", "param": None, "code": None}
            }
            return JSONResponse(error, status_code=int(mode))
        if body.get("model") == "bad":
            return JSONResponse(
                {"error": {"message": "no such model", "code": "model_not_found"}}, status_code=404
            )
        if mode == "slow" and await left_within(request, app.state.delay_s):
            app.state.left.append(time.monotonic())
            return Response(status_code=499)
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        text = f"hello from {name}"
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": "stop"} | (
                {"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text}
            )
            return JSONResponse(
                {"id": "x", "object": kind, "model": body["model"], "choices": [choice], "usage": usage}
            )
        options = body.get("stream_options")
        include = isinstance(options, dict) and bool(options.get("include_usage"))

        async def events():
            for i, piece in enumerate(text.split(" ")):
                delta = {"content": piece + " "} if kind == "chat" else None
                choice = {"index": 0, "finish_reason": None} | (
                    {"delta": delta} if delta else {"text": piece + " "}
                )
                chunk = {"id": "x", "object": "chunk", "model": body["model"], "choices": [choice]}
                yield f"data: {json.dumps(chunk | ({'usage': None} if include else {}))}\n\n"
                if mode == "cut" and i == 1:
                    raise RuntimeError("the replica died mid-stream")
                if mode == "drip":
                    await asyncio.sleep(app.state.delay_s)
            if include:
                yield f"data: {json.dumps({'id': 'x', 'object': 'chunk', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await answer(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, "completions")

    return app
