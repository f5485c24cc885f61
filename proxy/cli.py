"""The ``kvproxy`` command line: ``serve`` and ``models``.

Every field of ``Settings`` is a flag of the same name (``ttl`` -> ``--ttl``, ``no_cache`` ->
``--no-cache``); a flag given wins over the ``KVPROXY_*`` environment variable.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click
from pydantic import ValidationError

from engine.fetch import DEFAULT_MODEL, KNOWN_MODELS, ModelError, fetch_known_model
from proxy.config import Settings


def settings_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add one ``--flag`` per ``Settings`` field; absent flags arrive as None."""
    for name, field in reversed(Settings.model_fields.items()):
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} [env KVPROXY_{name.upper()}]"
        if field.annotation is bool:
            func = click.option(flag, name, is_flag=True, flag_value=True, default=None, help=help_text)(func)
        else:
            func = click.option(flag, name, default=None, help=help_text)(func)
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

    settings = load_settings(**flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        loaded = load_model(
            settings.model, cache_dir=settings.cache_dir, dtype=settings.dtype, device=settings.device
        )
    except ModelError as exc:
        click.echo(f"kvproxy: {exc}", err=True)
        sys.exit(1)
    click.echo(f"kvproxy: serving {loaded.name} on http://{settings.host}:{settings.port}/v1", err=True)
    uvicorn.run(create_app(settings, loaded), host=settings.host, port=settings.port)


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


if __name__ == "__main__":
    main()
