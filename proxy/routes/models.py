"""``GET /v1/models``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from engine.worker import Engine
from proxy.auth import get_tenant
from proxy.state import get_engine

router = APIRouter(dependencies=[Depends(get_tenant)])


@router.get("/v1/models")
async def list_models(engine: Annotated[Engine, Depends(get_engine)]) -> dict[str, Any]:
    model = {"id": engine.loaded.name, "object": "model", "created": 0, "owned_by": "kvproxy"}
    return {"object": "list", "data": [model]}
