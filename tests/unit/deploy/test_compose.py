"""docker-compose.yml and the Dockerfile agree with the settings class, and the Prometheus and
Grafana it runs are wired to the services that exist (no Docker engine here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from proxy.config import Settings
from proxy.router.settings import RouteSettings

ROOT = Path(__file__).resolve().parents[3]
FIELDS = {f"KVPROXY_{name.upper()}" for name in Settings.model_fields}
IMAGE = "kvproxy:local"


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def proxies() -> dict:
    return {name: s for name, s in compose()["services"].items() if name.startswith("proxy")}


def kvproxy_services() -> dict:
    """The services that run kvproxy's image (every one but Redis, Prometheus and Grafana)."""
    return {name: s for name, s in compose()["services"].items() if s["image"] == IMAGE}


def test_services_and_dependencies() -> None:
    """redis with a healthcheck; two proxy replicas with healthchecks, waiting for a healthy redis,
    the admin key and the model."""
    services = compose()["services"]
    assert set(services) == {"model", "keys", "redis", "proxy", "proxy-2", "router", "prometheus", "grafana"}
    assert "healthcheck" in services["redis"]
    for proxy in proxies().values():
        assert "healthcheck" in proxy
        assert proxy["depends_on"]["redis"]["condition"] == "service_healthy"
        assert proxy["depends_on"]["model"]["condition"] == "service_completed_successfully"


def test_one_image_is_built_for_every_kvproxy_service() -> None:
    """One service builds kvproxy:local from this checkout; the others run that image and build
    nothing, so `docker compose build` builds it once (not once per service)."""
    services = compose()["services"]
    builders = {name for name, s in services.items() if "build" in s}
    assert builders == {"model"} and services["model"]["build"] == "."
    assert set(kvproxy_services()) == {"model", "keys", "proxy", "proxy-2", "router"}


def test_the_model_is_fetched_before_the_replicas_start() -> None:
    """The one-shot `model` service fetches and converts, into the models volume, the model the
    replicas serve and the router renders prompts with; no healthcheck times it."""
    services = compose()["services"]
    model = services["model"]
    served = {s["environment"]["KVPROXY_MODEL"] for s in proxies().values()}
    assert served == {services["router"]["environment"]["KVPROXY_TOKENIZER"]}
    assert model["command"] == ["kvproxy", "models", "fetch", *served] and model["restart"] == "no"
    assert mounts(model)[model["environment"]["KVPROXY_CACHE_DIR"]] == "models"
    assert {mounts(proxy)[model["environment"]["KVPROXY_CACHE_DIR"]] for proxy in proxies().values()} == {
        "models"
    }


def test_redis_is_configured_as_a_cache_index() -> None:
    """Eviction only among keys with a TTL, a memory cap, append-only persistence on a volume."""
    command = compose()["services"]["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--maxmemory-policy"].startswith("volatile-") and options["--appendonly"] == "yes"
    assert "--maxmemory" in options and compose()["services"]["redis"]["volumes"][0].endswith(":/data")


def parsed(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A service's settings as the container reads them, its admin key file (written by the keys
    service) standing at a file of this test."""
    key = tmp_path / "admin_key"
    key.write_text("generated\n")
    fields = {k.removeprefix("KVPROXY_").lower(): v for k, v in env.items()}
    return fields | ({"admin_key": str(key)} if "admin_key" in fields else {})


def test_environment_names_are_settings_fields(tmp_path) -> None:
    """Every KVPROXY_* variable names a field, and the values parse as settings."""
    for proxy in proxies().values():
        env = proxy["environment"]
        assert set(env) <= FIELDS, set(env) - FIELDS
        settings = Settings(**parsed(env, tmp_path))
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
        mounts = dict(v.split(":")[:2] for v in proxy["volumes"])
        assert mounts["blobs"] == proxy["environment"]["KVPROXY_BLOB_DIR"]
        assert mounts["models"] == proxy["environment"]["KVPROXY_CACHE_DIR"]
        assert set(mounts) <= set(doc["volumes"])
    assert len(set(published)) == 2


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", re.sub(r"^\s*#.*\n", "", dockerfile(), flags=re.M))
    return [(line.split()[0].upper(), line.partition(" ")[2]) for line in text.splitlines() if line.strip()]


def test_dockerfile_env_names_are_settings_of_both_commands() -> None:
    """The image runs `kvproxy serve` and `kvproxy route`: its KVPROXY_* variables are settings of
    both (a variable that is no setting of the command started is warned about)."""
    route_fields = {f"KVPROXY_{name.upper()}" for name in RouteSettings.model_fields}
    names = {word.split("=")[0] for k, args in instructions() if k == "ENV" for word in args.split()}
    assert names and names <= FIELDS & route_fields, names - (FIELDS & route_fields)


def test_dockerfile_installs_dependencies_before_the_sources_and_declares_no_volume() -> None:
    """Every `pip install` of dependencies comes before the first source is copied, the project
    itself is installed --no-deps (a code change reinstalls it alone), and no VOLUME makes an
    anonymous volume per container."""
    steps = instructions()
    keywords = [k for k, _ in steps]
    assert "VOLUME" not in keywords
    first_source = next(i for i, (k, args) in enumerate(steps) if k == "COPY" and args.startswith("hashing"))
    installs = [(i, args) for i, (k, args) in enumerate(steps) if k == "RUN" and "pip install" in args]
    (project,) = [i for i, args in installs if args.rstrip().endswith(" .")]
    assert "--no-deps" in steps[project][1] and project > first_source
    assert all(i < first_source for i, _ in installs if i != project)


def test_torch_comes_from_a_build_argument_defaulting_to_the_cpu_index() -> None:
    """TORCH_INSTALL names where pip takes torch: PyTorch's CPU index unless overridden (a wheel
    put in deploy/wheels/, which the build context lets in and git ignores)."""
    args = dict(a.split("=", 1) for k, a in instructions() if k == "ARG")
    assert "--index-url https://download.pytorch.org/whl/cpu" in args["TORCH_INSTALL"]
    assert any(k == "RUN" and "pip install --no-cache-dir $TORCH_INSTALL" in a for k, a in instructions())
    assert "!deploy/wheels/" in (ROOT / ".dockerignore").read_text().split()
    assert "deploy/wheels/*.whl" in (ROOT / ".gitignore").read_text().split()


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore leaves out everything but the sources the Dockerfile copies, so .git, tests,
    docs and any virtualenv or cache in the checkout stay out of the build context."""
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == "*"
    let_in = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from"):
            copied |= {source.rstrip("/") for source in args.split()[:-1]}
    assert copied == let_in


def test_the_router_fronts_both_replicas(tmp_path) -> None:
    """The router's settings parse, name both replicas by service name and wait for them."""
    router = compose()["services"]["router"]
    env = router["environment"]
    settings = RouteSettings(**parsed(env, tmp_path))
    ports = {name: s["environment"]["KVPROXY_PORT"] for name, s in proxies().items()}
    assert settings.upstreams == [f"http://{name}:{port}/v1" for name, port in ports.items()]
    assert router["command"] == ["kvproxy", "route"] and router["ports"] == [
        f"{settings.port}:{settings.port}"
    ]
    assert {name for name, d in router["depends_on"].items() if d["condition"] == "service_healthy"} >= set(
        ports
    )
    assert f"{settings.port}/health" in router["healthcheck"]["test"][-1]


def mounts(service: dict) -> dict[str, str]:
    """A service's volumes as {container path: host path or volume name} (``:ro`` dropped)."""
    return {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}


def mounted_file(service: dict, container_path: str) -> Path:
    """The file in this checkout that ``service`` sees at ``container_path`` (a file or folder bind)."""
    for target, source in mounts(service).items():
        if container_path == target or container_path.startswith(f"{target}/"):
            assert source.startswith("./"), f"{target} is not a bind mount of this checkout"
            return ROOT / source / container_path.removeprefix(target).lstrip("/")
    raise AssertionError(f"nothing is mounted at {container_path}")


def prometheus_config() -> dict:
    service = compose()["services"]["prometheus"]
    flags = dict(flag.removeprefix("--").split("=", 1) for flag in service["command"])
    return yaml.safe_load(mounted_file(service, flags["config.file"]).read_text())


def grafana_file(container_path: str) -> Path:
    return mounted_file(compose()["services"]["grafana"], container_path)


def datasources() -> list[dict]:
    folder = grafana_file("/etc/grafana/provisioning/datasources")
    return [d for f in sorted(folder.glob("*.yml")) for d in yaml.safe_load(f.read_text())["datasources"]]


def dashboard_files() -> list[Path]:
    folder = grafana_file("/etc/grafana/provisioning/dashboards")
    providers = [p for f in sorted(folder.glob("*.yml")) for p in yaml.safe_load(f.read_text())["providers"]]
    return sorted(f for p in providers for f in grafana_file(p["options"]["path"]).glob("*.json"))


def test_monitoring_images_are_pinned_and_published() -> None:
    """Prometheus and Grafana run pinned releases, publish 9090 and 3000, and have healthchecks."""
    services = compose()["services"]
    for name, repository, port in (
        ("prometheus", "prom/prometheus", 9090),
        ("grafana", "grafana/grafana-oss", 3000),
    ):
        image, _, tag = services[name]["image"].partition(":")
        assert image == repository and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), services[name]["image"]
        assert services[name]["ports"] == [f"{port}:{port}"]
        assert f"{port}/" in services[name]["healthcheck"]["test"][-1]
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert mounts(services["prometheus"])["/prometheus"] in compose()["volumes"]


def test_the_stack_is_closed_by_an_admin_key_prometheus_holds() -> None:
    """Every kvproxy service requires the admin key the `keys` service writes once into the keys
    volume (none is written in this repository); Prometheus scrapes the replicas and the router,
    by service name and container port, on /metrics, with that same file."""
    services = compose()["services"]
    kvproxy = {name: s for name, s in services.items() if name.startswith("proxy") or name == "router"}
    (key_file,) = {s["environment"]["KVPROXY_ADMIN_KEY"] for s in kvproxy.values()}
    writer = services["keys"]
    assert key_file in " ".join(writer["command"]) and "secrets.token_urlsafe" in " ".join(writer["command"])
    for name in (*kvproxy, "prometheus"):
        assert mounts(services[name])[str(Path(key_file).parent)] == "keys", name
        assert services[name]["depends_on"]["keys"]["condition"] == "service_completed_successfully"
    targets = {}
    for job in prometheus_config()["scrape_configs"]:
        assert job["metrics_path"] == "/metrics"
        assert job["authorization"] == {"type": "Bearer", "credentials_file": key_file}
        for static in job["static_configs"]:
            targets.update(t.split(":") for t in static["targets"])
    assert targets == {name: s["environment"]["KVPROXY_PORT"] for name, s in kvproxy.items()}
    assert "ADMIN_KEY" not in (ROOT / "Dockerfile").read_text()


def test_grafana_is_provisioned_from_deploy() -> None:
    """Grafana mounts the provisioning folders and the dashboards folder; its home is kvproxy's."""
    grafana = compose()["services"]["grafana"]
    assert mounts(grafana)["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    assert [f.name for f in dashboard_files()] == ["kvproxy.json"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert grafana_file(home) == dashboard_files()[0]
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_the_datasource_is_the_compose_prometheus() -> None:
    """The one datasource is the prometheus service on its container port; its timeInterval is the
    scrape interval (the floor of $__rate_interval)."""
    (source,) = datasources()
    url = urlsplit(source["url"])
    (published,) = compose()["services"]["prometheus"]["ports"]
    assert source["type"] == "prometheus" and url.hostname == "prometheus"
    assert str(url.port) == published.split(":")[1]
    assert source["jsonData"]["timeInterval"] == prometheus_config()["global"]["scrape_interval"]


def test_every_dashboard_panel_has_a_title_a_unit_and_the_datasource() -> None:
    """Every panel but a row has a title, an axis unit and queries, all on the provisioned
    datasource's uid, and fits the 24-column grid."""
    (source,) = datasources()
    (path,) = dashboard_files()
    doc = json.loads(path.read_text())
    panels = doc["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    charts = [p for p in panels if p["type"] != "row"]
    assert len(charts) >= 10
    for panel in charts:
        assert panel["title"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["datasource"]["uid"] == source["uid"] and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"] and target["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
