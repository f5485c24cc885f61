"""Running a request on the engine from the event loop: submit it, wait for its prompt to be
computed (recording metrics and, when asked, an explanation), then collect the whole completion
or hand its events to the streaming response; or store a prompt's K/V without sampling
(``store_prompt``: prewarm, named caches). A client that goes away cancels its request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from engine.requests import (
    EngineBusy,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    PrefillDone,
    RequestHandle,
    TokenDelta,
)
from engine.worker import Engine
from hashing import BLOCK_SIZE, num_full_blocks
from proxy.http.auth import reads_own_text
from proxy.http.errors import OpenAIError
from proxy.observe.deps import get_metrics
from proxy.serving.explain import EXPLAIN_HEADER, Explanation, cache_headers, explain
from proxy.serving.facts import ModelFacts
from proxy.serving.turn import Usage
from proxy.state import get_cache, get_settings

DISCONNECT_POLL_S = 0.2
FLUSH_TIMEOUT_S = 30.0
"""Most seconds ``store_prompt`` waits for the blocks to be stored and indexed."""


class Running:
    """A submitted request as the event loop sees it: its events, in order, and cancellation."""

    def __init__(
        self, engine: Engine, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        loop = loop or asyncio.get_running_loop()
        self._on_finished: Callable[[Finished], None] | None = None
        self._finished: Finished | None = None
        self._text: list[str] = []
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.handle: RequestHandle = engine.submit(
            request, lambda event: loop.call_soon_threadsafe(self._deliver, event)
        )

    def on_finished(self, record: Callable[[Finished], None]) -> None:
        """Call ``record`` once with the ``Finished`` event, whether or not anyone reads it: a
        stream whose client left reads no more events, and its cancelled end is still counted."""
        self._on_finished = record
        self._record()

    @property
    def finished(self) -> Finished | None:
        """The ``Finished`` event once it arrived, else None."""
        return self._finished

    @property
    def text(self) -> str:
        """The completion's text so far (all of it once finished)."""
        return "".join(self._text)

    def _deliver(self, event: Event) -> None:
        self.events.put_nowait(event)
        if isinstance(event, TokenDelta | Finished):
            self._text.append(event.text)
        if isinstance(event, Finished):
            self._finished = event
            self._record()

    def _record(self) -> None:
        if self._finished is not None and self._on_finished is not None:
            record, self._on_finished = self._on_finished, None
            record(self._finished)

    def cancel(self) -> None:
        """Stop the generation at its next step (a no-op once it is finished)."""
        self.handle.cancel()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, Finished | Failed):
                return


@dataclass
class Started:
    """A request whose prompt is computed: the running request, the prefill outcome, the cache
    headers every response carries, the explanation when the client asked for one, and how many
    of its prompt's tokens it newly stores (``written_tokens``)."""

    running: Running
    done: PrefillDone
    headers: dict[str, str]
    explanation: Explanation | None
    written: int = 0

    def usage(self, completion_tokens: int) -> Usage:
        """The request's usage once ``completion_tokens`` were generated."""
        done = self.done
        return Usage(done.prompt_tokens, completion_tokens, done.cached_tokens, self.written)


@dataclass
class Completion:
    """A finished non-streaming completion."""

    text: str = ""
    finish_reason: str = "stop"
    tokens: list[TokenDelta] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    finished: Finished | None = None


def submit(
    engine: Engine, generation: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None
) -> Running:
    """Queue a request whose events go to ``loop`` (default: the running one), or answer 503
    with Retry-After when the engine is saturated."""
    try:
        return Running(engine, generation, loop)
    except EngineBusy:
        raise OpenAIError(
            503,
            "the server is busy; retry shortly",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": "1"},
        ) from None


async def start(
    request: Request,
    engine: Engine,
    tokenizer: Any,
    facts: ModelFacts,
    generation: GenerationRequest,
    ahead: Callable[[str], object] | None = None,
    tools_span: Callable[[], tuple[int, int]] | None = None,
) -> Started:
    """Submit a request and wait until its prompt is computed; record its metrics; once it ends
    (not cancelled), call ``ahead`` with its whole text (``proxy.serving.ahead.render_ahead``).
    ``tools_span`` gives where the tool definitions are, for an explanation (computed only then).

    A client that goes away meanwhile cancels the request.

    Raises:
        OpenAIError: 503 when the engine's queue is full; 499 when the client left.
    """
    if generation.grammar is None:
        running = submit(engine, generation)
    else:  # NOTE: queuing builds the grammar's matcher (seconds for a large schema): off the loop
        running = await run_in_threadpool(submit, engine, generation, asyncio.get_running_loop())
    watcher = asyncio.create_task(_cancel_on_disconnect(request, running))
    try:
        event = await running.events.get()
    finally:
        watcher.cancel()
    if isinstance(event, Failed):
        raise event.error
    if not isinstance(event, PrefillDone):  # cancelled before its prompt was computed
        raise OpenAIError(499, "the client closed the request", code="client_closed_request")
    metrics, cache = get_metrics(request), get_cache(request)
    namespace = facts.namespace(generation.tenant)
    arrived = request.scope["state"]["started"]
    ttft = metrics.observe(namespace.hex(), event, arrived)

    def finished(event: Finished) -> None:
        metrics.finished(namespace.hex(), event, arrived, ttft)
        if ahead is not None and event.finish_reason != "cancelled":
            ahead(running.text)

    running.on_finished(finished)
    explanation = None
    if request.headers.get(EXPLAIN_HEADER) == "1":
        tools = None if tools_span is None else await run_in_threadpool(tools_span)
        explanation = await explain(
            tokenizer,
            facts,
            cache,
            generation.tenant,
            generation.prompt_ids,
            event,
            reads_own_text(request),
            tools,
        )
    written = written_tokens(event, cache is not None, not get_settings(request).no_tails)
    return Started(running, event, cache_headers(event), explanation, written)


async def complete(started: Started, request: Request) -> Completion:
    """Wait for the whole completion; a client that goes away cancels the generation."""
    running = started.running
    watcher = asyncio.create_task(_cancel_on_disconnect(request, running))
    result = Completion()
    parts: list[str] = []
    try:
        async for event in running:
            if isinstance(event, TokenDelta):
                parts.append(event.text)
                result.tokens.append(event)
            elif isinstance(event, Finished):
                parts.append(event.text)
                result.text, result.finish_reason, result.finished = (
                    "".join(parts),
                    event.finish_reason,
                    event,
                )
                result.usage = started.usage(event.completion_tokens)
            elif isinstance(event, Failed):
                raise event.error
    finally:
        watcher.cancel()
        running.cancel()  # no-op when finished; stops the worker if this task was cancelled
    return result


async def _cancel_on_disconnect(request: Request, running: Running) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    running.cancel()


def written_tokens(done: PrefillDone, caching: bool, tails: bool) -> int:
    """Tokens of a prompt computed as ``done`` says that this request newly stores in the cache:
    those not cached, up to the prompt's end with tails, else up to its last full block; 0
    without a cache, and 0 for a prompt reused to its last token (that token's K/V was stored
    with it)."""
    if not caching or done.cached_tokens >= done.prompt_tokens - 1:
        return 0
    end = done.prompt_tokens if tails else BLOCK_SIZE * num_full_blocks(done.prompt_tokens)
    return max(0, end - done.cached_tokens)


async def store_prompt(engine: Engine, ids: list[int], tenant: str, ttl_s: int) -> None:
    """Compute ``ids`` (a non-empty prompt) and store its full blocks and tail with a TTL of
    ``ttl_s`` seconds, sampling nothing; returns once they are indexed (or ``FLUSH_TIMEOUT_S``
    passed).

    Raises:
        OpenAIError: the engine's error for the prompt; 503 when it was cancelled.
    """
    request = GenerationRequest(tuple(ids), max_tokens=1, tenant=tenant, cache_ttl_s=ttl_s, prewarm=True)
    async for event in submit(engine, request):
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished) and event.finish_reason == "cancelled":
            raise OpenAIError(503, "the prompt's computation was cancelled", type="server_error")
    await run_in_threadpool(engine.flush_saves, FLUSH_TIMEOUT_S)
