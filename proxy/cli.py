"""The ``kvproxy`` command line: ``serve``, ``models`` and ``cache``.

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
from pathlib import Path
from typing import Any

import click
from pydantic import BeforeValidator, ValidationError

from engine.fetch import DEFAULT_MODEL, KNOWN_MODELS, ModelError, fetch_known_model
from proxy.config import Settings


def settings_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add one ``--flag`` per ``Settings`` field; absent flags arrive as None."""
    for name, field in reversed(Settings.model_fields.items()):
        flag = "--" + name.replace("_", "-")
        default = (
            "" if field.default in (None, False) or field.default_factory else f"; default {field.default}"
        )
        help_text = f"{field.description} [env KVPROXY_{name.upper()}{default}]"
        if field.annotation is bool:
            func = click.option(flag, name, is_flag=True, flag_value=True, default=None, help=help_text)(func)
        else:
            # NOTE: sizes ("20MB") and other validated fields stay strings for pydantic to parse
            parsed = any(isinstance(m, BeforeValidator) for m in field.metadata)
            plain = None if parsed else field.annotation
            kind = {int: click.INT, float: click.FLOAT}.get(plain, click.STRING)  # type: ignore[call-overload]
            func = click.option(flag, name, type=kind, default=None, help=help_text)(func)
    return func


def load_settings(**flags: Any) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from exc


@click.group()
def main() -> None:
    """kvproxy: an OpenAI-compatible server with a persistent, shared prefix KV cache."""


@main.command()
@settings_options
def serve(**flags: Any) -> None:
    """Serve the model over the OpenAI API, through the prefix cache."""
    import uvicorn

    from engine.loading import load_model
    from proxy.app import create_app
    from proxy.auth import parse_api_keys

    settings = load_settings(**flags)
    try:
        parse_api_keys(settings.api_keys)
    except (ValueError, OSError) as exc:
        raise click.UsageError(f"--api-keys: {exc}") from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        loaded = load_model(
            settings.model, cache_dir=settings.cache_dir, dtype=settings.dtype, device=settings.device
        )
    except ModelError as exc:
        click.echo(f"kvproxy: {exc}", err=True)
        sys.exit(1)
    click.echo(f"kvproxy: serving {loaded.name} on http://{settings.host}:{settings.port}/v1", err=True)
    # NOTE: on SIGTERM, requests in flight get a bounded time to finish; pending cache saves are
    # then flushed by the app's shutdown.
    uvicorn.run(
        create_app(settings, loaded), host=settings.host, port=settings.port, timeout_graceful_shutdown=15
    )


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
    """The settings that locate a cache: Redis, key prefix, blob directory."""
    for name in reversed(("redis_url", "key_prefix", "blob_dir", "cache_dir", "redis_timeout")):
        field = Settings.model_fields[name]
        help_text = f"{field.description} [env KVPROXY_{name.upper()}]"
        func = click.option("--" + name.replace("_", "-"), name, default=None, help=help_text)(func)
    return func


def open_store(**flags: Any) -> tuple[Any, Any]:
    """The index and blob store the settings point at; exits 1 when Redis does not answer."""
    import redis

    from proxy.app import redis_client
    from store.blobs import BlobStore
    from store.index import RedisIndex

    settings = load_settings(**flags)
    index = RedisIndex(redis_client(settings), settings.key_prefix)
    try:
        index.ping()
    except redis.RedisError as exc:
        click.echo(
            f"kvproxy: Redis at {settings.redis_url} is unreachable ({exc}); set --redis-url", err=True
        )
        sys.exit(1)
    return index, BlobStore(settings.blob_root)


@main.group()
def cache() -> None:
    """Inspect and administer the prefix cache (no model needed)."""


@cache.command("stats")
@cache_options
def cache_stats(**flags: Any) -> None:
    """Deployment-wide counters, blocks and bytes, as JSON."""
    from store.stats import SharedStats

    index, blobs = open_store(**flags)
    totals = SharedStats(index.client, index.key_prefix).totals()
    stored = {"blocks": index.num_blocks(), "bytes": index.total_bytes(), "disk_bytes": blobs.used_bytes()}
    click.echo(json.dumps(totals | stored, indent=2, sort_keys=True))


@cache.command("gc")
@cache_options
@click.option(
    "--grace", type=float, default=60.0, show_default=True, help="Seconds an unindexed blob is kept."
)
def cache_gc(grace: float, **flags: Any) -> None:
    """Reconcile index and blob store: reclaim expired, orphaned and unindexed blocks."""
    from store.gc import collect

    index, blobs = open_store(**flags)
    click.echo(json.dumps(dataclasses.asdict(collect(index, blobs, grace)), indent=2))


@cache.command("clear")
@cache_options
@click.option("--namespace", default=None, help="Only this namespace (32 hex digits).")
def cache_clear(namespace: str | None, **flags: Any) -> None:
    """Remove every cached block, or one namespace's."""
    from store.gc import clear

    if namespace is not None and not re.fullmatch(r"[0-9a-f]{32}", namespace):
        raise click.BadParameter("a namespace is 32 lowercase hex digits", param_hint="--namespace")
    index, blobs = open_store(**flags)
    click.echo(json.dumps({"removed_blocks": clear(index, blobs, namespace)}))


@main.command()
@click.option(
    "--base-url", default="http://127.0.0.1:8000/v1", show_default=True, help="Any OpenAI-compatible /v1 URL."
)
@click.option("--model", default="smollm2-135m-instruct", show_default=True)
@click.option("--api-key", default="unused", envvar="OPENAI_API_KEY", help="Bearer key [env OPENAI_API_KEY]")
@click.option(
    "--workload",
    "names",
    multiple=True,
    default=["all"],
    show_default=True,
    type=click.Choice(["all", "shared", "multiturn", "docqa", "control"]),
)
@click.option("--prefix-tokens", default="512,1024,2048,4096", show_default=True, help="Shared-prefix sizes.")
@click.option(
    "--order", default="all", show_default=True, type=click.Choice(["all", "random", "tile", "interleave"])
)
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--json", "json_path", default=None, help="Also write the results (every request) as JSON here."
)
def bench(
    base_url: str,
    model: str,
    api_key: str,
    names: tuple[str, ...],
    prefix_tokens: str,
    order: str,
    concurrency: int,
    max_tokens: int,
    seed: int,
    json_path: str | None,
) -> None:
    """Measure TTFT, latency, throughput and cache hits of reproducible workloads."""
    from openai import OpenAI
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from proxy import benchmark

    sizes = [int(n) for n in prefix_tokens.split(",") if n.strip()]
    chosen = benchmark.workloads(list(names), seed, sizes, order)
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    summaries = []
    with Progress(console=Console(stderr=True)) as progress:
        for workload in chosen:
            total = sum(len(s.turns) for s in workload.sessions)
            task = progress.add_task(workload.name, total=total)
            summaries.append(
                benchmark.run(
                    client,
                    model,
                    workload,
                    concurrency=concurrency,
                    max_tokens=max_tokens,
                    on_result=lambda _r, t=task: progress.advance(t),
                )
            )
    table = Table(title=f"kvproxy bench: {base_url} (concurrency {concurrency}, seed {seed})")
    for column in (
        "workload",
        "requests",
        "TTFT p50 s",
        "TTFT p95 s",
        "latency p50 s",
        "latency p95 s",
        "output tok/s",
        "prompt tok",
        "cached tok",
        "hit rate",
    ):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for s in summaries:
        table.add_row(
            s.workload,
            str(s.requests),
            f"{s.ttft_p50_s:.3f}",
            f"{s.ttft_p95_s:.3f}",
            f"{s.latency_p50_s:.3f}",
            f"{s.latency_p95_s:.3f}",
            f"{s.output_tokens_per_s:.1f}",
            str(s.prompt_tokens),
            str(s.cached_tokens),
            f"{s.hit_rate:.1%}",
        )
    Console(width=max(160, Console().width)).print(table)
    if json_path:
        Path(json_path).write_text(benchmark.to_json(summaries))


if __name__ == "__main__":
    main()
