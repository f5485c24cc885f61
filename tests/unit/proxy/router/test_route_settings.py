"""``kvproxy route --help`` says what the router does: no flag's help speaks of what only ``serve``
does (``/v1/cache/*``, blobs, serving uncached), and the shared settings the router words its own
way keep ``serve``'s defaults and bounds."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.config import ServerSettings
from proxy.router.settings import RouteSettings

SERVE_ONLY = ("/v1/cache", "blobs", "uncached")
"""Words of what ``kvproxy serve`` does and the router does not."""


def help_of(command: str) -> str:
    """``kvproxy <command> --help`` as a user reads it (wide enough that no phrase is wrapped)."""
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("words", SERVE_ONLY)
def test_no_route_flag_speaks_of_what_only_serve_does(words) -> None:
    """Neither ``kvproxy route --help`` nor any router setting's description mentions ``words``;
    ``serve --help`` still does where it is true of serve (its admin routes, its blobs)."""
    assert words not in help_of("route")
    assert [n for n, f in RouteSettings.model_fields.items() if words in (f.description or "")] == []
    assert words in help_of("serve")


def test_the_router_has_no_anonymous_admin_flag() -> None:
    """``--allow-anonymous-admin`` opens ``serve``'s /v1/cache/* routes, which the router does not
    have: no flag or variable of ``kvproxy route``."""
    assert "--allow-anonymous-admin" not in help_of("route")
    assert "allow_anonymous_admin" not in RouteSettings.model_fields
    result = CliRunner().invoke(main, ["route", "--upstream", "http://a:1/v1", "--allow-anonymous-admin"])
    assert result.exit_code == 2 and "No such option" in result.output, result.output


def test_shared_settings_worded_for_the_router_keep_serves_default_and_bounds() -> None:
    """Every shared setting the router declares again (all but ``--port``, 8080 on purpose) differs
    from ``ServerSettings``'s in its description alone."""
    reworded = []
    for name, shared in ServerSettings.model_fields.items():
        own = RouteSettings.model_fields.get(name)
        if own is None or name == "port":
            continue
        assert (own.annotation, own.default, own.default_factory, own.metadata) == (
            shared.annotation,
            shared.default,
            shared.default_factory,
            shared.metadata,
        ), name
        if own.description != shared.description:
            reworded.append(name)
    assert sorted(reworded) == [
        "admin_key",
        "api_keys",
        "cache_dir",
        "chat_template",
        "key_prefix",
        "redis_retry",
        "redis_url",
    ]


def test_the_reworded_settings_validate_as_serves_do(tmp_path) -> None:
    """The shared validators still hold for the fields declared again: a Redis URL of another
    scheme is refused, ``--admin-key`` names a file holding the key, ``--redis-retry`` must be > 0."""
    key = tmp_path / "admin.key"
    key.write_text("s3cret\n")
    settings = RouteSettings(upstream="http://a:1/v1", admin_key=str(key))
    assert settings.admin_key == "s3cret"
    for bad in ({"redis_url": "http://redis:6379"}, {"redis_retry": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RouteSettings(upstream="http://a:1/v1", **bad)
