"""Gemini's ``models.list``, ``models.get`` and ``models.countTokens`` (``/v1beta``): the served
model under each of its names, and a prompt's length as ``generateContent`` renders it (a named
cache's content included)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from proxy.gemini.generate import NamedDep, prompt_messages
from proxy.gemini.protocol import GenerateContentRequest, model_name
from proxy.http.auth import Tenant, get_tenant
from proxy.named import service
from proxy.serving.validation import check_model
from proxy.state import EngineDep

router = APIRouter()
METHODS = ["generateContent", "streamGenerateContent", "countTokens", "createCachedContent"]


def described(engine: Engine, name: str) -> dict[str, Any]:
    """A ``Model`` resource: its name, token limits and the methods served."""
    return {
        "name": f"models/{name}",
        "baseModelId": engine.loaded.name,
        "displayName": name,
        "inputTokenLimit": engine.loaded.context_length,
        "outputTokenLimit": engine.loaded.context_length,
        "supportedGenerationMethods": METHODS,
    }


@router.get("/v1beta/models", dependencies=[Depends(get_tenant)])
async def listing(engine: EngineDep) -> dict[str, Any]:
    return {"models": [described(engine, name) for name in engine.loaded.served_names]}


@router.get("/v1beta/models/{model}", dependencies=[Depends(get_tenant)])
async def get(model: str, engine: EngineDep) -> dict[str, Any]:
    check_model(engine, model_name(model))
    return described(engine, model_name(model))


@router.post("/v1beta/models/{model}:countTokens")
async def count_tokens(
    model: str, body: GenerateContentRequest, engine: EngineDep, named: NamedDep, tenant: Tenant
) -> dict[str, Any]:
    """``totalTokens``: the prompt's length, in tokens, as ``generateContent`` would render it."""
    messages = await prompt_messages(engine, named, tenant, model_name(model), body)
    return {"totalTokens": len(await run_in_threadpool(service.rendered, engine, messages))}
