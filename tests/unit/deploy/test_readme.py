"""README.md stays true: its configuration table lists exactly the settings."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.config import ServerSettings, Settings
from proxy.router.settings import RouteSettings

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def test_configuration_table_lists_every_setting() -> None:
    rows = re.findall(r"^\| `--([a-z-]+)` \| `(KVPROXY_[A-Z_]+)` \|", README, flags=re.M)
    assert {flag.replace("-", "_") for flag, _ in rows} == set(Settings.model_fields)
    assert all(env == f"KVPROXY_{flag.replace('-', '_').upper()}" for flag, env in rows)


def test_ci_runs_the_readme_test_command() -> None:
    command = 'pip install torch==2.13.0 -e ".[test]" && pytest'
    assert command in README
    assert command in (Path(__file__).resolve().parents[3] / ".ci" / "run").read_text()


def test_router_flags_are_documented() -> None:
    """docs/router.md's table lists exactly the flags the router adds to the shared ones."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "router.md").read_text()
    rows = re.findall(r"^\| `--([a-z-]+)` \| `(KVPROXY_[A-Z_]+)` \|", doc, flags=re.M)
    own = set(RouteSettings.model_fields) - set(ServerSettings.model_fields)
    assert {flag.replace("-", "_") for flag, _ in rows} == own
