"""``GET /v1/models``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from proxy.http.auth import get_tenant
from proxy.openai.replies import ModelCard
from proxy.serving.facts import ModelFacts, served_model
from proxy.serving.validation import check_model
from proxy.state import EngineDep

router = APIRouter(dependencies=[Depends(get_tenant)])


def describe(facts: ModelFacts, name: str) -> ModelCard:
    """OpenAI's model object, with vLLM's ``max_model_len`` and ``root``."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "kvproxy",
        "root": facts.name,
        "max_model_len": facts.context_length,
    }


@router.get("/v1/models")
async def list_models(engine: EngineDep) -> dict[str, Any]:
    facts = served_model(engine).facts
    return {"object": "list", "data": [describe(facts, name) for name in facts.served_names]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, engine: EngineDep) -> dict[str, Any]:
    facts = served_model(engine).facts
    check_model(facts, model_id)
    return dict(describe(facts, model_id))
