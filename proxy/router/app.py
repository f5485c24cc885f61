"""``kvproxy route``: the router's ASGI app. No model is loaded; ``--tokenizer`` loads only a
tokenizer and its chat template.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and
``/v1/messages`` (routed and forwarded; a Responses request continuing a stored response goes to
the replica that answered it), ``GET``/``DELETE /v1/responses/{id}`` and its ``input_items`` (to
that replica), ``POST /v1/messages/count_tokens``, ``/tokenize``, ``/detokenize``,
``GET /version`` and ``GET /v1/models/{id}`` (passed on), ``GET /v1/models`` (the union of the
replicas'), Gemini's ``/v1beta`` routes (``proxy.router.gemini``: generation routed, named caches
on the replica holding them), ``GET /health``, ``GET /metrics``, ``GET /stats`` and
``GET /dashboard`` (predicted against reported hit rate per replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import xxhash
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.model.chat_template import use_chat_template
from engine.model.fetch import ModelError, convert_in_child
from engine.model.resolve import resolve_model_dir
from proxy.http.auth import Tenant, parse_api_keys, require_operator
from proxy.http.errors import install_error_handlers
from proxy.http.limits import BodySizeLimit
from proxy.index_place import with_index
from proxy.router import gemini
from proxy.router.deps import RouterDep, RouteTenant, credentials, route_tenant
from proxy.router.forward import forward, pass_through, while_connected
from proxy.router.identity import Identity
from proxy.router.index import RouteIndex
from proxy.router.listing import union
from proxy.router.policy import Endpoint
from proxy.router.replicas import Replica
from proxy.router.routing import Router
from proxy.router.settings import RouteSettings
from store.index.memory.index import MEMORY_URL
from store.index.redis.connect import redis_client

log = logging.getLogger("route")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

api = APIRouter()


def load_identity(settings: RouteSettings) -> Identity:
    """The tokenizer ``--tokenizer`` names (a known model, a ``.gguf`` file, a checkpoint
    directory or a hub id), with a fingerprint of its files; text hashing without one.

    NOTE: the fast tokenizer class, not ``AutoTokenizer``, whose import loads torch (its
    configuration machinery); a model still to convert is converted in a child process. The
    router process never imports torch.

    Raises:
        engine.model.fetch.ModelError: the name or directory is not a model, or has no
            ``tokenizer.json``.
    """
    if settings.tokenizer is None:
        return Identity(None)
    from transformers import PreTrainedTokenizerFast

    _, path = resolve_model_dir(settings.tokenizer, settings.cache_dir, convert_in_child, flag="--tokenizer")
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path} has no tokenizer.json: the router loads fast tokenizers only")
    digest = xxhash.xxh3_128()
    for name in TOKENIZER_FILES:
        if (path / name).is_file():
            digest.update(name.encode() + (path / name).read_bytes())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    if (template := settings.chat_template_text) is not None:
        use_chat_template(tokenizer, template)
        digest.update(b"--chat-template\0" + template.encode())
    return Identity(tokenizer, digest.hexdigest())


def create_route_app(settings: RouteSettings, identity: Identity | None = None) -> FastAPI:
    """The router app for ``settings`` (``identity``: already loaded, else from ``--tokenizer``).

    Raises:
        store.index.embedded.files.EmbeddedIndexError: the default, embedded index cannot be
            kept in the cache directory (``proxy.index_place``).
    """
    settings = with_index(settings)
    api_keys = parse_api_keys(settings.api_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        known = identity if identity is not None else await asyncio.to_thread(load_identity, settings)
        index = None
        if not settings.redis_url.startswith(MEMORY_URL):
            index = RouteIndex(
                redis_client(settings.redis_url, settings.redis_timeout),
                settings.key_prefix,
                uuid.uuid4().hex[:12],
            )
        router = Router(settings, index, known)
        app.state.router = router
        await router.probe_all()
        prober = asyncio.create_task(router.probe_forever())
        log.info(
            "routing to %s (%s, prompts hashed as %s)",
            ", ".join(r.url for r in router.replicas.all),
            settings.policy,
            "text" if known.tokenizer is None else "token ids",
        )
        yield
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober
        await router.close()

    app = FastAPI(title="kvproxy route", lifespan=lifespan)
    app.state.api_keys, app.state.settings = api_keys, settings
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(api)
    app.include_router(gemini.api)
    return app


async def _forward(request: Request, router: Router, tenant: str, kind: Endpoint) -> Response:
    raw = await request.body()
    return await while_connected(request, forward(router, request, kind, raw, tenant))


@api.post("/v1/chat/completions")
async def chat(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    return await _forward(request, router, tenant, "chat")


@api.post("/v1/completions")
async def completions(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    return await _forward(request, router, tenant, "completions")


@api.post("/v1/responses")
async def responses(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    return await _forward(request, router, tenant, "responses")


@api.post("/v1/messages")
async def messages(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    return await _forward(request, router, tenant, "messages")


@api.get("/v1/responses/{response_id}")
@api.delete("/v1/responses/{response_id}")
@api.get("/v1/responses/{response_id}/input_items")
async def stored_response(
    request: Request, response_id: str, tenant: RouteTenant, router: RouterDep
) -> Response:
    """A stored response, from the replica that answered it (any other shares its Redis)."""
    return await pass_through(router, request, await router.response_replica(tenant, response_id))


@api.post("/v1/messages/count_tokens", dependencies=[Depends(route_tenant)])
@api.post("/tokenize", dependencies=[Depends(route_tenant)])
@api.post("/detokenize", dependencies=[Depends(route_tenant)])
@api.get("/version")
async def no_prompt(request: Request, router: RouterDep) -> Response:
    """Routes that compute nothing worth routing for: the least loaded replica answers."""
    return await pass_through(router, request)


@api.get("/v1/models")
async def models(request: Request, _: Tenant, router: RouterDep) -> dict[str, Any]:
    """The union of the models the replicas that are up list (the first listing wins)."""

    def url_of(replica: Replica) -> str:
        return f"{replica.url}/models"

    return {
        "object": "list",
        "data": await union(router, url_of, (credentials(request)[0], None), "data", "id"),
    }


@api.get("/v1/models/{model_id:path}", dependencies=[Depends(route_tenant)])
async def model(request: Request, model_id: str, router: RouterDep) -> Response:
    """One model, from the least loaded replica serving it."""
    return await pass_through(router, request, model=model_id)


@api.get("/health")
async def health(router: RouterDep) -> JSONResponse:
    """200 while some replica is up; ``degraded`` while Redis is down (local counts only)."""
    up = {r.url: r.available for r in router.replicas.all}
    redis = "off" if router.index is None else ("ok" if router.redis_ok else "down")
    status = "ok" if any(up.values()) and redis != "down" else "degraded"
    body = {
        "status": status,
        "mode": "route",
        "policy": router.settings.policy,
        "redis": redis,
        "replicas": up,
    }
    return JSONResponse(body, status_code=200 if any(up.values()) else 503)


@api.get("/metrics", dependencies=[Depends(require_operator)])
async def metrics(router: RouterDep) -> Response:
    return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@api.get("/stats", dependencies=[Depends(require_operator)])
async def stats(router: RouterDep) -> dict[str, Any]:
    up = {r.url: r.available for r in router.replicas.all}
    return {"policy": router.settings.policy} | router.metrics.stats(up, dict(router.replicas.inflight))


@api.get("/dashboard")
async def dashboard() -> HTMLResponse:
    return HTMLResponse(resources.files("proxy").joinpath("static/route_dashboard.html").read_text())
