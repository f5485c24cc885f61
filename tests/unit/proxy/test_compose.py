"""docker-compose.yml and the Dockerfile agree with the settings class (no Docker engine here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from proxy.config import RouteSettings, Settings

ROOT = Path(__file__).resolve().parents[3]
FIELDS = {f"KVPROXY_{name.upper()}" for name in Settings.model_fields}


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def proxies() -> dict:
    return {name: s for name, s in compose()["services"].items() if name.startswith("proxy")}


def test_services_and_dependencies() -> None:
    """redis with a healthcheck; two proxy replicas built here, waiting for a healthy redis."""
    services = compose()["services"]
    assert set(services) == {"redis", "proxy", "proxy-2", "router"}
    assert "healthcheck" in services["redis"]
    for proxy in proxies().values():
        assert proxy["build"] == "." and "healthcheck" in proxy
        assert proxy["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis_is_configured_as_a_cache_index() -> None:
    """Eviction only among keys with a TTL, a memory cap, append-only persistence on a volume."""
    command = compose()["services"]["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--maxmemory-policy"].startswith("volatile-") and options["--appendonly"] == "yes"
    assert "--maxmemory" in options and compose()["services"]["redis"]["volumes"][0].endswith(":/data")


def test_environment_names_are_settings_fields() -> None:
    """Every KVPROXY_* variable names a field, and the values parse as settings."""
    for proxy in proxies().values():
        env = proxy["environment"]
        assert set(env) <= FIELDS, set(env) - FIELDS
        settings = Settings(**{k.removeprefix("KVPROXY_").lower(): v for k, v in env.items()})
        assert settings.redis_url.startswith("redis://redis:")  # the compose service name


def test_replicas_share_blobs_and_publish_distinct_ports() -> None:
    """Both replicas mount the same blob and model volumes; container port = KVPROXY_PORT = EXPOSE."""
    doc = compose()
    published = []
    for proxy in proxies().values():
        port = proxy["environment"]["KVPROXY_PORT"]
        (mapping,) = proxy["ports"]
        host, container = mapping.split(":")
        assert container == port and f"EXPOSE {port}" in (ROOT / "Dockerfile").read_text()
        published.append(host)
        mounts = dict(v.split(":") for v in proxy["volumes"])
        assert mounts["blobs"] == proxy["environment"]["KVPROXY_BLOB_DIR"]
        assert mounts["models"] == proxy["environment"]["KVPROXY_CACHE_DIR"]
        assert set(mounts) <= set(doc["volumes"])
    assert len(set(published)) == 2


def test_dockerfile_env_names_are_settings_fields() -> None:
    text = (ROOT / "Dockerfile").read_text()
    names = {word.split("=")[0] for word in text.split() if word.startswith("KVPROXY_")}
    assert names and names <= FIELDS, names - FIELDS


def test_the_router_fronts_both_replicas() -> None:
    """The router's settings parse, name both replicas by service name and wait for them."""
    router = compose()["services"]["router"]
    env = router["environment"]
    settings = RouteSettings(**{k.removeprefix("KVPROXY_").lower(): v for k, v in env.items()})
    ports = {name: s["environment"]["KVPROXY_PORT"] for name, s in proxies().items()}
    assert settings.upstreams == [f"http://{name}:{port}/v1" for name, port in ports.items()]
    assert router["command"] == ["kvproxy", "route"] and router["ports"] == [
        f"{settings.port}:{settings.port}"
    ]
    assert {name for name, d in router["depends_on"].items() if d["condition"] == "service_healthy"} >= set(
        ports
    )
    assert f"{settings.port}/health" in router["healthcheck"]["test"][-1]
