"""``kvproxy cache``: ``stats``, ``gc`` and ``clear`` read Redis and the blob store directly (no
model needed); ``prewarm``, ``export`` and ``import`` run against a running server over HTTP, so
the server's own model, chat template, tenants and store decide what is cached."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import httpx
from rich.progress import Progress

from proxy.config import Settings
from proxy.flags import load_settings, option
from proxy.index_place import located
from store.errors import StoreUnavailable
from store.index.redis.connect import redact_url

TIMEOUT_S = 600.0


def server_options(func: Any) -> Any:
    """``--base-url`` and ``--api-key``."""
    func = option(
        "--api-key",
        envvar="KVPROXY_API_KEY",
        default=None,
        help="API key (the tenant's; the admin key for export and import) [env KVPROXY_API_KEY]",
    )(func)
    return option(
        "--base-url", default="http://127.0.0.1:8000/v1", show_default=True, help="The server's API base URL."
    )(func)


def client(base_url: str, api_key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=TIMEOUT_S)


def fail(message: str) -> NoReturn:
    click.echo(f"kvproxy: {message}", err=True)
    sys.exit(1)


def error_text(response: httpx.Response) -> str:
    """The message of an OpenAI-shaped error answer, or its status line."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"


def read_bodies(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    """``(line number, body)`` per non-empty line of a JSON-lines file; a line that is not a JSON
    object is kept as its error message."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        fail(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})")
    bodies: list[tuple[int, dict[str, Any] | str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            bodies.append((number, f"not JSON: {exc.msg}"))
            continue
        bodies.append((number, body if isinstance(body, dict) else "not a JSON object"))
    return bodies


@click.command("prewarm")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@server_options
def prewarm(file: Path, base_url: str, api_key: str | None) -> None:
    """Cache the prompts of FILE (JSON lines of /v1/cache/prewarm bodies: `messages` or `prompt`,
    optional `add_generation_prompt` and `ttl`) on a running server."""
    bodies = read_bodies(file)
    totals = {"prompts": 0, "stored_blocks": 0, "cached_blocks": 0, "failed": 0}
    with client(base_url, api_key) as http, Progress(transient=True) as progress:
        task = progress.add_task("prewarming", total=len(bodies))
        for number, body in bodies:
            outcome = body
            if isinstance(body, dict):
                try:
                    response = http.post("/cache/prewarm", json=body)
                except httpx.HTTPError as exc:
                    fail(f"cannot reach {redact_url(base_url)}: {exc}")
                if response.status_code in (401, 403):
                    fail(error_text(response))
                outcome = response.json() if response.status_code == 200 else error_text(response)
            if isinstance(outcome, str):
                totals["failed"] += 1
                progress.console.print(f"line {number}: {outcome}", style="red")
            else:
                totals["prompts"] += 1
                totals["stored_blocks"] += outcome["stored_blocks"]
                totals["cached_blocks"] += outcome["cached_blocks"]
            progress.advance(task)
    click.echo(json.dumps(totals))
    if totals["failed"]:
        sys.exit(1)


@click.command("export")
@option(
    "--prompts",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON lines of prompts (prewarm bodies) whose cached blocks to export.",
)
@click.option("--all", "everything", is_flag=True, help="Export every cached block of the tenant.")
@option("--tenant", default="default", show_default=True, help="Whose cache (a tenant name).")
@option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Archive to write.")
@server_options
def export(
    prompts: Path | None, everything: bool, tenant: str, out: Path, base_url: str, api_key: str | None
) -> None:
    """Write a snapshot of a running server's cached blocks (its admin key) to --out."""
    if (prompts is None) == (not everything):
        raise click.UsageError("give either --prompts FILE or --all")
    body: dict[str, Any] = {"tenant": tenant, "all": everything}
    if prompts is not None:
        bodies = read_bodies(prompts)
        if bad := [f"line {n}: {b}" for n, b in bodies if isinstance(b, str)]:
            fail("; ".join(bad))
        body["prompts"] = [b for _, b in bodies]
    partial = out.with_name(out.name + ".partial")
    try:
        with client(base_url, api_key) as http, http.stream("POST", "/cache/export", json=body) as response:
            if response.status_code != 200:
                response.read()
                fail(error_text(response))
            with partial.open("wb") as file:
                for data in response.iter_bytes():
                    file.write(data)
            blocks, skipped = (int(response.headers.get(f"x-kvproxy-{h}", 0)) for h in ("blocks", "skipped"))
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        fail(f"cannot reach {redact_url(base_url)}: {exc}")
    partial.replace(out)
    click.echo(
        json.dumps({"out": str(out), "blocks": blocks, "skipped": skipped, "bytes": out.stat().st_size})
    )
    if skipped:
        click.echo(
            f"kvproxy: {skipped} listed blocks could not be read or verified and were left out", err=True
        )


@click.command("import")
@click.argument("snapshot", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@server_options
def import_(snapshot: Path, base_url: str, api_key: str | None) -> None:
    """Load a snapshot into a running server's index and blob store (its admin key); prints what
    was imported, already cached and rejected, and exits 1 when a block was rejected."""
    try:
        with client(base_url, api_key) as http, snapshot.open("rb") as file:
            headers = {"Content-Type": "application/x-tar"}
            response = http.post("/cache/import", content=file, headers=headers)
    except httpx.HTTPError as exc:
        fail(f"cannot reach {redact_url(base_url)}: {exc}")
    if response.status_code != 200:
        fail(error_text(response))
    report = response.json()
    click.echo(json.dumps(report, indent=2))
    if report["rejected"]:
        sys.exit(1)


@click.group()
def cache() -> None:
    """Inspect and administer the prefix cache: stats, gc and clear read Redis and the blob store
    directly (no model needed); prewarm, export and import ask a running server."""


def cache_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The settings that locate a cache: Redis, key prefix, blob directory or URL."""
    for name in reversed(("redis_url", "key_prefix", "blob_dir", "blob_url", "cache_dir", "redis_timeout")):
        field = Settings.model_fields[name]
        help_text = f"{field.description} [env KVPROXY_{name.upper()}]"
        func = option("--" + name.replace("_", "-"), name, help=help_text)(func)
    return func


def open_admin(**flags: Any) -> tuple[Settings, Any]:
    """The flags' settings (the embedded index joined) and the cache they point at
    (``proxy.stores.open_admin``); exits 1 when Redis does not answer, saying why (too slow, not
    there, refused credentials)."""
    from proxy.stores import open_admin as open_store_admin
    from proxy.stores import redis_trouble

    # NOTE: a command says what failed itself, but the embedded index's warnings (a damaged file set
    # aside) are said as they come
    logging.getLogger("store").setLevel(logging.CRITICAL)
    logging.getLogger("store.index.embedded").setLevel(logging.WARNING)
    settings = located(load_settings(**flags))
    admin = open_store_admin(settings)
    if admin.health() != "ok":
        fail(redis_trouble(settings))
    return settings, admin


@cache.command("stats")
@cache_options
def cache_stats(**flags: Any) -> None:
    """Deployment-wide counters, blocks and bytes, as JSON."""
    stats = open_admin(**flags)[1].deployment_stats()
    if stats is None:  # NOTE: Redis answered the ping but not the counters (a cluster node is down)
        fail("the deployment's counters could not be read from Redis")
    click.echo(json.dumps(stats.as_dict(), indent=2, sort_keys=True))


@cache.command("gc")
@cache_options
@option("--grace", type=float, default=60.0, show_default=True, help="Seconds an unindexed blob is kept.")
def cache_gc(grace: float, **flags: Any) -> None:
    """Reconcile index and blob store: reclaim expired, orphaned and unindexed blocks."""
    try:
        found = open_admin(**flags)[1].gc(grace)
    except OSError as exc:
        fail(f"the blob store failed during the collection: {exc}")
    if found is None:  # NOTE: Redis answered the ping, then failed during the collection
        fail("Redis stopped answering during the collection; nothing more was done")
    click.echo(json.dumps(dataclasses.asdict(found), indent=2))


@cache.command("clear")
@cache_options
@option("--namespace", default=None, help="Only this namespace (32 hex digits).")
def cache_clear(namespace: str | None, **flags: Any) -> None:
    """Remove every cached block, or one namespace's, and the named caches they held."""
    if namespace is not None and not re.fullmatch(r"[0-9a-f]{32}", namespace):
        raise click.BadParameter("a namespace is 32 lowercase hex digits", param_hint="--namespace")
    from proxy.named.lifecycle import forget_cleared
    from proxy.stores import open_named

    try:
        settings, admin = open_admin(**flags)
        removed = admin.clear(namespace)
        named = forget_cleared(open_named(settings), namespace)
    except OSError as exc:
        fail(f"the blob store failed while clearing: {exc}")
    except StoreUnavailable:
        fail("Redis stopped answering while clearing; nothing more was done")
    click.echo(json.dumps({"removed_blocks": removed, "removed_named_caches": named}))


for command in (prewarm, export, import_):
    cache.add_command(command)
