"""docker-compose.yml and the Dockerfile agree with the settings class (no Docker engine here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from proxy.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_dependencies() -> None:
    """redis with a healthcheck; proxy built here, waiting for a healthy redis."""
    services = compose()["services"]
    assert set(services) == {"redis", "proxy"}
    assert "healthcheck" in services["redis"] and "healthcheck" in services["proxy"]
    assert services["proxy"]["build"] == "."
    assert services["proxy"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_environment_names_are_settings_fields() -> None:
    """Every KVPROXY_* variable names a field, and the values parse as settings."""
    env = compose()["services"]["proxy"]["environment"]
    fields = {f"KVPROXY_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= fields, set(env) - fields
    settings = Settings(**{k.removeprefix("KVPROXY_").lower(): v for k, v in env.items()})
    assert settings.redis_url.startswith("redis://redis:")  # the compose service name


def test_port_and_volumes_match_settings() -> None:
    """Published port = KVPROXY_PORT = Dockerfile EXPOSE; blobs and models live on volumes."""
    doc = compose()
    proxy = doc["services"]["proxy"]
    port = proxy["environment"]["KVPROXY_PORT"]
    assert f"{port}:{port}" in proxy["ports"]
    assert f"EXPOSE {port}" in (ROOT / "Dockerfile").read_text()
    mounts = {v.split(":")[1] for v in proxy["volumes"]}
    assert {proxy["environment"]["KVPROXY_BLOB_DIR"], proxy["environment"]["KVPROXY_CACHE_DIR"]} <= mounts
    assert {v.split(":")[0] for v in proxy["volumes"]} <= set(doc["volumes"])


def test_dockerfile_env_names_are_settings_fields() -> None:
    fields = {f"KVPROXY_{name.upper()}" for name in Settings.model_fields}
    text = (ROOT / "Dockerfile").read_text()
    names = {word.split("=")[0] for word in text.split() if word.startswith("KVPROXY_")}
    assert names and names <= fields, names - fields
