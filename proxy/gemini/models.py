"""Gemini's ``models.list``, ``models.get`` and ``models.countTokens`` (``/v1beta``): the served
model under each of its names, and a prompt's length as ``generateContent`` renders it (a named
cache's content included)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from proxy.gemini.answers import ModelList, ModelResource, TokenCount
from proxy.gemini.generate import prompt_messages
from proxy.gemini.protocol import GenerateContentRequest, model_name
from proxy.gemini.turns import gemini_turn
from proxy.http.auth import Tenant, get_tenant
from proxy.http.numbers import page_bounds
from proxy.named.service import NamedDep
from proxy.serving.facts import served_model
from proxy.serving.prompts import render_turn
from proxy.serving.validation import check_model
from proxy.state import EngineDep

router = APIRouter()
METHODS = ["generateContent", "streamGenerateContent", "countTokens", "createCachedContent"]
PAGE_MOST = 1000
"""The largest ``pageSize`` of a listing (Gemini's)."""


def described(engine: Engine, name: str) -> ModelResource:
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
async def listing(
    engine: EngineDep,
    page_size: Annotated[str, Query(alias="pageSize")] = "50",
    page_token: Annotated[str, Query(alias="pageToken")] = "",
) -> dict[str, Any]:
    """The served model under each of its names, ``pageSize`` a page (Gemini's default 50, at
    most ``PAGE_MOST``; ``nextPageToken`` the next).

    Raises:
        OpenAIError: 400 for a ``pageSize`` or ``pageToken`` this server did not give.
    """
    start, size = page_bounds(page_token, page_size, PAGE_MOST)
    names = engine.loaded.served_names
    out: ModelList = {"models": [described(engine, name) for name in names[start : start + size]]}
    if start + size < len(names):
        out["nextPageToken"] = str(start + size)
    return dict(out)


@router.get("/v1beta/models/{model}", dependencies=[Depends(get_tenant)])
async def get(model: str, engine: EngineDep) -> dict[str, Any]:
    check_model(served_model(engine).facts, model_name(model))
    return dict(described(engine, model_name(model)))


@router.post("/v1beta/models/{model}:countTokens")
async def count_tokens(
    model: str, body: GenerateContentRequest, engine: EngineDep, named: NamedDep, tenant: Tenant
) -> dict[str, Any]:
    """``totalTokens``: the prompt's length, in tokens, as ``generateContent`` would render it."""
    (tokenizer, facts), name = served_model(engine), model_name(model)
    messages = await prompt_messages(facts, named, tenant, name, body)
    turn = gemini_turn(body, name, tenant, messages)
    prompt = await run_in_threadpool(render_turn, tokenizer, facts.vocab_size, turn)
    counted: TokenCount = {"totalTokens": len(prompt.ids)}
    return dict(counted)
