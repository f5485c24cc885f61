"""``GET /v1/models``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from engine.worker import Engine
from proxy.http.auth import get_tenant
from proxy.serving.validation import check_model
from proxy.state import EngineDep

router = APIRouter(dependencies=[Depends(get_tenant)])


def describe(engine: Engine, name: str) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's ``max_model_len`` and ``root``."""
    loaded = engine.loaded
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "kvproxy",
        "root": loaded.name,
        "max_model_len": loaded.context_length,
    }


@router.get("/v1/models")
async def list_models(engine: EngineDep) -> dict[str, Any]:
    return {"object": "list", "data": [describe(engine, name) for name in engine.loaded.served_names]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, engine: EngineDep) -> dict[str, Any]:
    check_model(engine, model_id)
    return describe(engine, model_id)
