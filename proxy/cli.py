"""The ``kvproxy`` command line: ``serve``, ``models``, ``cache`` and ``bench`` (``bench.cli``).

Every field of ``Settings`` is a flag of the same name (``ttl`` -> ``--ttl``, ``no_cache`` ->
``--no-cache``); a flag given wins over the ``KVPROXY_*`` environment variable.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

import click
from pydantic import BeforeValidator, ValidationError

from bench.cli import bench
from engine.fetch import DEFAULT_MODEL, KNOWN_MODELS, ModelError, fetch_known_model
from proxy.cache_http import HTTP_COMMANDS
from proxy.config import RouteSettings, ServerSettings, Settings

S = TypeVar("S", bound=ServerSettings)


def settings_options(func: Callable[..., Any], fields: type[ServerSettings] = Settings) -> Callable[..., Any]:
    """Add one ``--flag`` per field of ``fields``; absent flags arrive as None."""
    for name, field in reversed(fields.model_fields.items()):
        flag = "--" + name.replace("_", "-")
        default = (
            ""
            if field.is_required() or field.default in (None, False) or field.default_factory
            else f"; default {field.default}"
        )
        help_text = f"{field.description} [env KVPROXY_{name.upper()}{default}]"
        if field.annotation is bool:
            func = click.option(flag, name, is_flag=True, flag_value=True, default=None, help=help_text)(func)
        else:
            # NOTE: sizes ("20MB") and other validated fields stay strings for pydantic to parse
            parsed = any(isinstance(m, BeforeValidator) for m in field.metadata)
            kinds: dict[object, click.ParamType] = {int: click.INT, float: click.FLOAT}
            kind = click.STRING if parsed else kinds.get(field.annotation, click.STRING)
            if get_origin(field.annotation) is Literal:
                kind = click.Choice(get_args(field.annotation))
            func = click.option(flag, name, type=kind, default=None, help=help_text)(func)
    return func


def route_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One ``--flag`` per ``RouteSettings`` field."""
    return settings_options(func, RouteSettings)


def load_settings(**flags: Any) -> Settings:
    """``kvproxy serve``'s settings from the environment, overridden by the flags given."""
    return parse_settings(Settings, flags)


def parse_settings(kind: type[S], flags: dict[str, Any]) -> S:
    """``kind`` from the environment, overridden by the flags that were given."""
    try:
        return kind(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        problems = [
            (f"--{str(e['loc'][0]).replace('_', '-')}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise click.UsageError("; ".join(problems)) from exc


@click.group()
def main() -> None:
    """kvproxy: an OpenAI-compatible server with a persistent, shared prefix KV cache."""


@main.command()
@settings_options
def serve(**flags: Any) -> None:
    """Serve the model over the OpenAI API, through the prefix cache."""
    import uvicorn

    from engine.loading import load_model_apart
    from proxy.app import create_app, server_config
    from proxy.auth import parse_api_keys
    from proxy.stores import blob_budget

    settings = load_settings(**flags)
    try:
        parse_api_keys(settings.api_keys)
    except (ValueError, OSError) as exc:
        raise click.UsageError(f"--api-keys: {exc}") from exc
    if not settings.no_cache:
        try:
            blob_budget(settings)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        loaded = load_model_apart(
            settings.model,
            cache_dir=settings.cache_dir,
            dtype=settings.dtype,
            weights=settings.weights,
            device=settings.device,
        )
    except ModelError as exc:
        click.echo(f"kvproxy: {exc}", err=True)
        sys.exit(1)
    click.echo(f"kvproxy: serving {loaded.name} on http://{settings.host}:{settings.port}/v1", err=True)
    # NOTE: on SIGTERM, requests in flight get a bounded time to finish; pending cache saves are
    # then flushed by the app's shutdown.
    app = create_app(settings, loaded)
    uvicorn.Server(server_config(app, settings, timeout_graceful_shutdown=15)).run()


@main.command()
@route_options
def route(**flags: Any) -> None:
    """Route requests to several OpenAI-compatible servers, each to the replica most likely to
    hold its prefix (docs/router.md)."""
    import uvicorn

    from proxy.app import server_config
    from proxy.auth import parse_api_keys
    from proxy.route.app import create_route_app, load_identity

    settings = parse_settings(RouteSettings, flags)
    try:
        parse_api_keys(settings.api_keys)
        identity = load_identity(settings)
    except (ValueError, OSError, ModelError) as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # NOTE: not a line per health probe
    click.echo(f"kvproxy: routing on http://{settings.host}:{settings.port}/v1", err=True)
    app = create_route_app(settings, identity)
    uvicorn.Server(server_config(app, settings, timeout_graceful_shutdown=15)).run()


@main.group()
def models() -> None:
    """Fetch and list models."""


@models.command("fetch")
@click.argument("name", default=DEFAULT_MODEL)
@click.option("--cache-dir", default=None, help="Where models are kept [env KVPROXY_CACHE_DIR]")
def models_fetch(name: str, cache_dir: str | None) -> None:
    """Download and convert a known model (default: smollm2-135m-instruct)."""
    settings = load_settings(cache_dir=cache_dir)
    try:
        path = fetch_known_model(name, settings.cache_dir / "models")
    except ModelError as exc:
        click.echo(f"kvproxy: {exc}", err=True)
        sys.exit(1)
    click.echo(str(path))


@models.command("list")
@click.option("--cache-dir", default=None, help="Where models are kept [env KVPROXY_CACHE_DIR]")
def models_list(cache_dir: str | None) -> None:
    """Known model names and the models already converted."""
    models_dir = load_settings(cache_dir=cache_dir).cache_dir / "models"
    for name, known in KNOWN_MODELS.items():
        state = "ready" if (models_dir / name / "config.json").exists() else "not fetched"
        click.echo(f"{name}\t{state}\t(from {known.wheel})")
    if models_dir.is_dir():
        for path in sorted(p for p in models_dir.iterdir() if p.is_dir() and p.name not in KNOWN_MODELS):
            if not path.name.startswith("."):
                click.echo(f"{path}\tready")


def cache_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The settings that locate a cache: Redis, key prefix, blob directory or URL."""
    for name in reversed(("redis_url", "key_prefix", "blob_dir", "blob_url", "cache_dir", "redis_timeout")):
        field = Settings.model_fields[name]
        help_text = f"{field.description} [env KVPROXY_{name.upper()}]"
        func = click.option("--" + name.replace("_", "-"), name, default=None, help=help_text)(func)
    return func


def open_admin(**flags: Any) -> Any:
    """The cache the flags point at (``proxy.stores.open_admin``); exits 1 when Redis does not
    answer."""
    from proxy.stores import open_admin as open_store_admin

    settings = load_settings(**flags)
    admin = open_store_admin(settings)
    if admin.health() != "ok":
        click.echo(f"kvproxy: Redis at {settings.redis_url} is unreachable; set --redis-url", err=True)
        sys.exit(1)
    return admin


@main.group()
def cache() -> None:
    """Inspect and administer the prefix cache: stats, gc and clear read Redis and the blob store
    directly (no model needed); prewarm, export and import ask a running server."""


@cache.command("stats")
@cache_options
def cache_stats(**flags: Any) -> None:
    """Deployment-wide counters, blocks and bytes, as JSON."""
    stats = open_admin(**flags).deployment_stats()
    if stats is None:  # NOTE: Redis answered the ping but not the counters (a cluster node is down)
        click.echo("kvproxy: the deployment's counters could not be read from Redis", err=True)
        sys.exit(1)
    click.echo(json.dumps(stats, indent=2, sort_keys=True))


@cache.command("gc")
@cache_options
@click.option(
    "--grace", type=float, default=60.0, show_default=True, help="Seconds an unindexed blob is kept."
)
def cache_gc(grace: float, **flags: Any) -> None:
    """Reconcile index and blob store: reclaim expired, orphaned and unindexed blocks."""
    click.echo(json.dumps(dataclasses.asdict(open_admin(**flags).gc(grace)), indent=2))


@cache.command("clear")
@cache_options
@click.option("--namespace", default=None, help="Only this namespace (32 hex digits).")
def cache_clear(namespace: str | None, **flags: Any) -> None:
    """Remove every cached block, or one namespace's."""
    if namespace is not None and not re.fullmatch(r"[0-9a-f]{32}", namespace):
        raise click.BadParameter("a namespace is 32 lowercase hex digits", param_hint="--namespace")
    click.echo(json.dumps({"removed_blocks": open_admin(**flags).clear(namespace)}))


for command in HTTP_COMMANDS:
    cache.add_command(command)
main.add_command(bench)

if __name__ == "__main__":
    main()
