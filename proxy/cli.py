"""The ``kvproxy`` command line: ``serve``, ``route``, ``models``, ``cache``
(``proxy.cache_commands``) and ``bench`` (``bench.cli``).

Every field of ``Settings`` is a flag of the same name (``ttl`` -> ``--ttl``, ``no_cache`` ->
``--no-cache``; ``proxy.flags``); a flag given wins over the ``KVPROXY_*`` environment variable.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

import click

from bench.cli import bench
from engine.model.convert import convert_gguf
from engine.model.fetch import DEFAULT_MODEL, KNOWN_MODELS, ModelError, fetch_known_model
from proxy.cache_commands import cache
from proxy.config import Settings
from proxy.flags import load_settings, parse_settings, route_options, settings_options
from proxy.index_place import located
from proxy.router.settings import RouteSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@click.group()
def main() -> None:
    """kvproxy: an OpenAI-compatible server with a persistent, shared prefix KV cache."""


def check_port(host: str, port: int) -> None:
    """Raises click.UsageError when ``host:port`` cannot be listened on (another server has it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.UsageError(f"cannot listen on {host}:{port}: {exc.strerror} (--port)") from exc


def run_server(config: Any, doing: str) -> None:
    """Run uvicorn with ``config``; say ``kvproxy: <doing> on <url>`` once the port is open."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                click.echo(f"kvproxy: {doing} on http://{config.host}:{config.port}/v1", err=True)

    Server(config).run()


@main.command()
@settings_options
def serve(**flags: Any) -> None:
    """Serve the model over the OpenAI API, through the prefix cache."""
    from engine.model.loading import load_model_apart
    from proxy.app import create_app
    from proxy.http.auth import parse_api_keys
    from proxy.http.limits import server_config
    from proxy.http.redact import redact_root_handlers
    from proxy.stores import blob_budget

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # NOTE: before the settings warn
    redact_root_handlers()
    settings = parse_settings(Settings, flags)
    try:
        parse_api_keys(settings.api_keys)
    except (ValueError, OSError) as exc:
        raise click.UsageError(f"--api-keys: {exc}") from exc
    if not settings.no_cache:
        try:
            blob_budget(settings)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        except OSError as exc:
            click.echo(
                f"kvproxy: cannot make the blob directory {settings.blob_root} ({exc}): give a writable "
                "--cache-dir (KVPROXY_CACHE_DIR) or --blob-dir",
                err=True,
            )
            sys.exit(1)
    check_port(settings.host, settings.port)  # NOTE: before the model loads, not after
    settings = located(settings)
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
    # NOTE: on SIGTERM, requests in flight get a bounded time to finish; pending cache saves are
    # then flushed by the app's shutdown.
    app = create_app(settings, loaded)
    run_server(server_config(app, settings, timeout_graceful_shutdown=15), f"serving {loaded.name}")


@main.command()
@route_options
def route(**flags: Any) -> None:
    """Route requests to several OpenAI-compatible servers, each to the replica most likely to
    hold its prefix (docs/router.md)."""
    from proxy.http.auth import parse_api_keys
    from proxy.http.limits import server_config
    from proxy.http.redact import redact_root_handlers
    from proxy.router.app import create_route_app, load_identity

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # NOTE: before the settings warn
    redact_root_handlers()
    settings = parse_settings(RouteSettings, flags)
    try:
        parse_api_keys(settings.api_keys)
        identity = load_identity(settings)
    except (ValueError, OSError, ModelError) as exc:
        raise click.UsageError(str(exc)) from exc
    logging.getLogger("httpx").setLevel(logging.WARNING)  # NOTE: not a line per health probe
    check_port(settings.host, settings.port)
    app = create_route_app(located(settings), identity)
    run_server(server_config(app, settings, timeout_graceful_shutdown=15), "routing")


@main.group()
def models() -> None:
    """Fetch and list models."""


@models.command("fetch")
@click.argument("name", default=DEFAULT_MODEL)
@click.option("--cache-dir", default=None, help="Where models are kept [env KVPROXY_CACHE_DIR]")
def models_fetch(name: str, cache_dir: str | None) -> None:
    """Download and convert a known model (default: smollm2-135m-instruct; `kvproxy models list`
    names them all)."""
    settings = load_settings(cache_dir=cache_dir)
    try:
        path = fetch_known_model(name, settings.cache_dir / "models", convert_gguf)
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
        click.echo(f"{name}\t{state}\t(from {', '.join(known.wheels)})")
    if models_dir.is_dir():
        for path in sorted(p for p in models_dir.iterdir() if p.is_dir() and p.name not in KNOWN_MODELS):
            if not path.name.startswith("."):
                click.echo(f"{path}\tready")


main.add_command(cache)
main.add_command(bench)

if __name__ == "__main__":
    main()
