"""Portable cache snapshots: ``POST /v1/cache/export`` answers a tar archive of cached blocks,
``POST /v1/cache/import`` takes one (``store.snapshot.format`` has the format). Admin key only: a
snapshot holds a tenant's K/V and token ids, and an import writes into the shared store.

The blocks' identity is the engine's (``LoadedModel.identity``), handed down to the store as a
value: the export writes it into the manifest, the import compares the manifest with it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from hashing import NamespaceIdentity
from proxy.cache_api.protocol import ExportRequest
from proxy.http.auth import DEFAULT_TENANT, require_admin
from proxy.http.errors import OpenAIError
from proxy.openai.turns import prompt_ids
from proxy.serving.facts import served_model
from proxy.state import CacheOnDep, EngineDep, SettingsDep
from store.errors import StoreUnavailable
from store.snapshot.format import SnapshotError, SnapshotMismatch

router = APIRouter(prefix="/v1/cache", dependencies=[Depends(require_admin)])

SPOOL_BYTES = 64 * 1024 * 1024
"""Archive bytes kept in memory before they go to a temporary file."""
CHUNK_BYTES = 1024 * 1024


def identities(request: Request, engine: Engine) -> dict[str, NamespaceIdentity]:
    """This server's cache identity for each tenant it serves: the API keys' (``proxy.http.auth``),
    or ``default`` without."""
    api_keys: dict[str, str] | None = request.app.state.api_keys
    tenants = set(api_keys.values()) if api_keys is not None else {DEFAULT_TENANT}
    return {t: engine.loaded.identity(t) for t in sorted(tenants)}


@router.post("/export")
async def export(
    body: ExportRequest, request: Request, engine: EngineDep, cache: CacheOnDep
) -> StreamingResponse:
    """A snapshot archive (``application/x-tar``) of the tenant's cached blocks of the prompts,
    or of all its blocks; ``X-Kvproxy-Blocks`` says how many it holds and
    ``X-Kvproxy-Skipped`` how many were listed but could not be read or verified.

    Raises:
        OpenAIError: 400 for a tenant this server does not serve, 404 when no block is cached.
    """
    served = identities(request, engine)
    if body.tenant not in served:
        raise OpenAIError(
            400,
            f"the tenant {body.tenant!r} is not a tenant of this server (its tenants: {', '.join(served)})",
            param="tenant",
            code="unknown_tenant",
        )
    prompts = None
    tokenizer, facts = served_model(engine)
    if body.prompts is not None:
        prompts = [
            await run_in_threadpool(
                prompt_ids,
                tokenizer,
                facts.vocab_size,
                p.messages,
                p.prompt,
                p.add_generation_prompt,
                p.tools,
            )
            for p in body.prompts
        ]
    out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    try:
        manifest = await run_in_threadpool(
            cache.export_snapshot, out, served[body.tenant], prompts, facts.name
        )
    except StoreUnavailable as exc:
        out.close()
        raise OpenAIError.cache_unavailable(f": {exc}") from exc
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
async def import_(
    request: Request, engine: EngineDep, cache: CacheOnDep, settings: SettingsDep
) -> dict[str, Any]:
    """Load a snapshot archive (the request body, at most ``--max-import-bytes``) into this
    deployment's index and blob store; answers the blocks imported, already cached and rejected
    (with why). With ``--audit-imports`` the imported blocks are served only once the engine has
    recomputed them (``awaiting_audit`` says how many wait)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as source:
        received = 0
        async for data in request.stream():
            received += len(data)
            if received > settings.max_import_bytes:
                raise OpenAIError(
                    413, f"the snapshot is larger than {settings.max_import_bytes} bytes (--max-import-bytes)"
                )
            source.write(data)
        source.seek(0)
        audit, served = settings.audit_imports, identities(request, engine)
        try:
            report = await run_in_threadpool(cache.import_snapshot, source, served, audit)
        except SnapshotMismatch as exc:
            raise OpenAIError(400, str(exc), code="snapshot_mismatch") from exc
        except SnapshotError as exc:
            raise OpenAIError(400, str(exc), code="invalid_snapshot") from exc
        except StoreUnavailable as exc:
            raise OpenAIError.cache_unavailable(f": {exc}") from exc
    if report.chains:
        engine.audit_imports(served[report.tenant].digest(), report.chains)
    return {"object": "cache.import", **report.as_dict()}
