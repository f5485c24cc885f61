"""Settings as command-line flags: one ``--flag`` per settings field, parsed by pydantic (a flag
given wins over the ``KVPROXY_*`` environment variable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

import click
from pydantic import BeforeValidator, ValidationError

from proxy.config import ServerSettings, Settings, ToolSettings
from proxy.router.settings import RouteSettings

S = TypeVar("S", bound=ServerSettings)
LISTS = frozenset({"upstream", "api_keys", "served_model_name"})
"""Settings holding comma-separated lists: a flag given twice adds to the list."""


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
            func = option(flag, name, type=kind, help=help_text)(func)
    return func


def option(*decls: str, **attrs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``click.option`` for a flag that takes a value and may be given once (``given_once``)."""
    default = attrs.pop("default", None)
    defaults = () if default is None else (default,)
    return click.option(*decls, multiple=True, default=defaults, callback=given_once, **attrs)


def given_once(_ctx: click.Context, param: click.Parameter, given: tuple[Any, ...]) -> Any:
    """A flag's value (None when absent). Given several times: one comma-separated list for the
    settings in ``LISTS``, else a usage error; a repeated flag is never silently dropped."""
    if not given:
        return None
    if len(given) == 1:
        return given[0]
    if param.name in LISTS:
        return ",".join(str(v) for v in given)
    # NOTE: the values are not repeated back: a flag may hold a key or a password
    raise click.BadParameter(f"given {len(given)} times; give it once", param=param)


def route_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One ``--flag`` per ``RouteSettings`` field."""
    return settings_options(func, RouteSettings)


def load_settings(**flags: Any) -> ToolSettings:
    """``kvproxy serve``'s settings, as ``kvproxy cache`` and ``kvproxy models`` read them, from the
    environment, overridden by the flags given."""
    return parse_settings(ToolSettings, flags)


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
