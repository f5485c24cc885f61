"""The app factory: ``create_app(settings)``; the lifespan builds the engine and the cache."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from engine.model.loading import LoadedModel, load_model_apart
from engine.worker import Engine
from proxy.anthropic import messages
from proxy.cache_api import admin as cache_admin
from proxy.cache_api import prewarm, snapshots
from proxy.config import Settings
from proxy.gemini import caches as gemini_caches
from proxy.gemini import generate as gemini_generate
from proxy.gemini import models as gemini_models
from proxy.http.auth import parse_api_keys
from proxy.http.errors import install_error_handlers
from proxy.http.limits import BodySizeLimit
from proxy.index_place import with_index
from proxy.named.lifecycle import sweep_forever
from proxy.observe import api as observe_api
from proxy.observe import health
from proxy.observe.metrics import Metrics, RequestMetrics
from proxy.observe.usage import UsageHistory
from proxy.openai import chat, completions, models, tokenize
from proxy.responses import routes as responses
from proxy.stores import open_cache, open_named, open_responses
from store.index.redis.connect import redact_url

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, loaded: LoadedModel | None = None) -> FastAPI:
    """The kvproxy ASGI app.

    Args:
        settings: configuration (default: from the environment).
        loaded: an already loaded model to serve (tests share one); loaded from
            ``settings.model`` at start-up when None.

    Raises:
        store.index.embedded.files.EmbeddedIndexError: the default, embedded index cannot be
            kept in the cache directory (``proxy.index_place``).
    """
    settings = with_index(settings or Settings())
    api_keys = parse_api_keys(settings.api_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # NOTE: a model handed in (tests share one, the CLI loads it first) gets --chat-template here
        model = loaded.with_chat_template(settings.chat_template_text) if loaded is not None else None
        if model is None:
            model = await run_in_threadpool(
                load_model_apart,
                settings.model,
                cache_dir=settings.cache_dir,
                dtype=settings.dtype,
                weights=settings.weights,
                device=settings.device,
                chat_template=settings.chat_template_text,
            )
        if settings.served_model_name:
            names = tuple(n.strip() for n in settings.served_model_name.split(",") if n.strip())
            model = dataclasses.replace(model, name=names[0], aliases=names)
        model = model.with_block_format(settings.block_format)
        block_cache = None if settings.no_cache else open_cache(settings, model.kv_spec)
        engine = Engine(
            model,
            block_cache,
            settings.max_queue,
            settings.max_batch,
            settings.audit_rate,
            settings.decode_threads,
            speculation=not settings.no_speculation,
        )
        admin = block_cache.admin if block_cache is not None else None
        app.state.settings, app.state.cache, app.state.engine = settings, admin, engine
        app.state.started = time.time()
        app.state.responses = open_responses(settings)
        app.state.named = open_named(settings)
        sweeper = None if admin is None else asyncio.create_task(sweep_forever(admin, app.state.named))
        app.state.metrics = Metrics(engine, admin)
        app.state.usage = UsageHistory(admin.usage if admin is not None else lambda: None)
        if admin is not None:
            app.state.usage.start()
        log.info(
            "serving %s (cache %s)",
            model.name,
            "off" if block_cache is None else redact_url(settings.blob_location),
        )
        yield
        if sweeper is not None:
            sweeper.cancel()
        app.state.usage.stop()
        if block_cache is not None:
            block_cache.close()
        await run_in_threadpool(engine.close)

    app = FastAPI(title="kvproxy", lifespan=lifespan)
    app.state.api_keys, app.state.settings = api_keys, settings
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_bytes, streamed=frozenset({"/v1/cache/import"})
    )
    app.add_middleware(RequestMetrics)
    install_error_handlers(app)
    for module in (
        chat,
        completions,
        responses,
        messages,
        gemini_generate,
        gemini_caches,
        gemini_models,
        tokenize,
        models,
        health,
        prewarm,
        snapshots,
        cache_admin,
        observe_api,
    ):
        app.include_router(module.router)
    return app
