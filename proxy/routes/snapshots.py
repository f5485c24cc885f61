"""Portable cache snapshots: ``POST /v1/cache/export`` answers a tar archive of cached blocks,
``POST /v1/cache/import`` takes one (``store.snapshot`` has the format). Admin key only: a
snapshot holds a tenant's K/V and token ids, and an import writes into the shared store.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, model_validator
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from hashing import BLOCK_SIZE, FORMAT_VERSION
from proxy.auth import DEFAULT_TENANT, require_admin
from proxy.errors import OpenAIError
from proxy.routes.prewarm import PrewarmRequest, prompt_ids
from proxy.state import CacheDep, EngineDep
from store.admin_interface import CacheAdmin
from store.connect import REDIS_ERRORS
from store.snapshot import SnapshotError, SnapshotMismatch

router = APIRouter(prefix="/v1/cache", dependencies=[Depends(require_admin)])

SPOOL_BYTES = 64 * 1024 * 1024
"""Archive bytes kept in memory before they go to a temporary file."""
CHUNK_BYTES = 1024 * 1024


def identity(engine: Engine, tenant: str) -> dict[str, Any]:
    """What a snapshot's blocks are valid for: this server's model and formats, and the tenant."""
    loaded = engine.loaded
    return {
        "model": loaded.name,
        "model_fingerprint": loaded.fingerprint,
        "kv_dtype": loaded.kv_spec.dtype,
        "weights": loaded.weights,
        "device": loaded.device.type,
        "block_size": BLOCK_SIZE,
        "block_format_version": FORMAT_VERSION,
        "tenant": tenant,
        "namespace": loaded.namespace(tenant).hex(),
    }


def tenants(request: Request) -> list[str]:
    """The tenants this server serves: the API keys' (``proxy.auth``), or ``default`` without."""
    api_keys: dict[str, str] | None = request.app.state.api_keys
    return sorted(set(api_keys.values())) if api_keys is not None else [DEFAULT_TENANT]


def known_tenant(request: Request, tenant: str, whose: str) -> str:
    """``tenant`` when this server serves it.

    Raises:
        SnapshotError: naming the tenants it serves.
    """
    if tenant not in (served := tenants(request)):
        raise SnapshotError(
            f"{whose} tenant {tenant!r} is not a tenant of this server (its tenants: {', '.join(served)})"
        )
    return tenant


def _cache(cache: CacheAdmin | None) -> CacheAdmin:
    if cache is None:
        raise OpenAIError(400, "caching is off on this server (--no-cache)", code="cache_disabled")
    return cache


def _unavailable(exc: Exception) -> OpenAIError:
    return OpenAIError(503, f"Redis is unreachable: {exc}", type="server_error", code="cache_unavailable")


class ExportRequest(BaseModel):
    """Which blocks to export: those of ``prompts`` (prewarm bodies) or ``all`` of a tenant's."""

    tenant: str = Field(DEFAULT_TENANT, min_length=1, description="Whose cache (a tenant name).")
    prompts: list[PrewarmRequest] | None = Field(None, min_length=1)
    all: bool = False

    @model_validator(mode="after")
    def _one_selection(self) -> ExportRequest:
        if (self.prompts is None) == (not self.all):
            raise ValueError("give either `prompts` or `all: true`")
        return self


@router.post("/export")
async def export(
    body: ExportRequest, request: Request, engine: EngineDep, cache: CacheDep
) -> StreamingResponse:
    """A snapshot archive (``application/x-tar``) of the tenant's cached blocks of the prompts,
    or of all its blocks; ``X-Kvproxy-Blocks`` says how many it holds and
    ``X-Kvproxy-Skipped`` how many were listed but could not be read or verified.

    Raises:
        OpenAIError: 400 for a tenant this server does not serve, 404 when no block is cached.
    """
    admin = _cache(cache)
    try:
        known_tenant(request, body.tenant, "the")
    except SnapshotError as exc:
        raise OpenAIError(400, str(exc), param="tenant", code="unknown_tenant") from exc
    prompts = None
    if body.prompts is not None:
        prompts = [await run_in_threadpool(prompt_ids, engine, p) for p in body.prompts]
    out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    namespace = engine.loaded.namespace(body.tenant)
    try:
        manifest = await run_in_threadpool(
            admin.export_snapshot, out, namespace, identity(engine, body.tenant), prompts
        )
    except REDIS_ERRORS as exc:
        out.close()
        raise _unavailable(exc) from exc
    if not manifest["blocks"]:
        out.close()
        what = "the prompts" if prompts is not None else f"tenant {body.tenant!r}"
        why = (
            f" ({manifest['skipped']} indexed blocks could not be read or verified)"
            if manifest["skipped"]
            else ""
        )
        raise OpenAIError(404, f"nothing to export: no cached block of {what}{why}", code="nothing_cached")
    out.seek(0)

    def chunks() -> Iterator[bytes]:
        with out:
            while data := out.read(CHUNK_BYTES):
                yield data

    headers = {
        "Content-Disposition": 'attachment; filename="kvproxy-snapshot.tar"',
        "X-Kvproxy-Blocks": str(len(manifest["blocks"])),
        "X-Kvproxy-Skipped": str(manifest["skipped"]),
    }
    return StreamingResponse(chunks(), media_type="application/x-tar", headers=headers)


@router.post("/import")
async def import_(request: Request, engine: EngineDep, cache: CacheDep) -> dict[str, Any]:
    """Load a snapshot archive (the request body) into this deployment's index and blob store;
    answers the blocks imported, already cached and rejected (with why)."""
    admin = _cache(cache)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as source:
        async for data in request.stream():
            source.write(data)
        source.seek(0)
        try:
            report = await run_in_threadpool(
                admin.import_snapshot,
                source,
                lambda t: identity(engine, known_tenant(request, t, "the snapshot's")),
            )
        except SnapshotMismatch as exc:
            raise OpenAIError(400, str(exc), code="snapshot_mismatch") from exc
        except SnapshotError as exc:
            raise OpenAIError(400, str(exc), code="invalid_snapshot") from exc
        except REDIS_ERRORS as exc:
            raise _unavailable(exc) from exc
    return {"object": "cache.import", **report.__dict__}
