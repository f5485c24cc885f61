"""The Grafana dashboard (``deploy/grafana``) queries only series kvproxy exports: a real server on
the tiny model and a real router in front of it, with the compose stack's keys (none), scraped on
the paths the compose stack's Prometheus scrapes, with no token, as it does."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.router.app import create_route_app
from proxy.router.identity import Identity
from proxy.router.settings import RouteSettings
from tests.api import Api
from tests.helpers import ServerThread, random_tokens

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kvproxy.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# NOTE: every series kvproxy exports is named kvproxy_* or vllm:*; no PromQL function, keyword,
# label name or Grafana $__ variable starts so. Quoted label values are removed first, so a
# matcher like {job="kvproxy_x"} is not read as a metric.
METRIC = re.compile(r"(?<![\w:])(?:kvproxy_|vllm:)[A-Za-z0-9_:]*")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')

# The series names a family of each type exports (a counter ``x`` as ``x_total``, a histogram as
# ``x_bucket``, ``x_sum`` and ``x_count``); the parser names counters without ``_total``.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    return set(METRIC.findall(STRING.sub('""', expr)))


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    return [p for top in doc["panels"] for p in (top, *top.get("panels", []))]


def queried_metrics() -> dict[str, set[str]]:
    """{metric name: titles of the panels (or template variables) whose queries select it}."""
    doc = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t.get("expr", "")) for p in panels(doc) for t in p.get("targets", [])]
    for variable in doc.get("templating", {}).get("list", []):
        query = variable.get("query", "")
        queries.append((variable["name"], query.get("query", "") if isinstance(query, dict) else query))
    found: dict[str, set[str]] = defaultdict(set)
    for title, expr in queries:
        for name in metric_names(expr):
            found[name].add(title)
    return found


def exported(page: str) -> set[str]:
    """The series names a /metrics page exports: each family's, by its type, and every sample's."""
    names: set[str] = set()
    for family in text_string_to_metric_families(page):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def scrape_paths() -> dict[str, str]:
    """{"router" or "replica": the path Prometheus scrapes it on}, from the compose stack's config;
    every job sends the admin key from the file the services read it from (we scrape as it does)."""
    paths: dict[str, str] = {}
    for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]:
        assert job["authorization"]["credentials_file"] == compose_environment("proxy")["KVPROXY_ADMIN_KEY"]
        for static in job["static_configs"]:
            for target in static["targets"]:
                kind = "router" if target.split(":")[0] == "router" else "replica"
                assert paths.setdefault(kind, job.get("metrics_path", "/metrics")) == job["metrics_path"]
    return paths


def compose_environment(service: str) -> dict[str, str]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]["environment"]


def keys_of(service: str, key_file: Path) -> dict[str, str | None]:
    """The admin key and API keys a compose service runs with (None: not set), its key file
    (``/run/kvproxy/admin_key`` in the stack) standing at ``key_file`` here."""
    env = compose_environment(service)
    admin = env.get("KVPROXY_ADMIN_KEY")
    return {"admin_key": str(key_file) if admin else None, "api_keys": env.get("KVPROXY_API_KEYS")}


def test_metric_names_are_read_from_promql() -> None:
    """Names before {, [ or ), inside functions and aggregations; not functions, labels or strings."""
    expr = (
        'histogram_quantile(0.95, sum by (le, cache) (rate(kvproxy_x_bucket{cache="kvproxy_no"}[5m])))'
        " / (sum(vllm:y_total) > 0) + kvproxy_z"
    )
    assert metric_names(expr) == {"kvproxy_x_bucket", "vllm:y_total", "kvproxy_z"}


def test_every_metric_the_dashboard_queries_is_exported(settings, tiny_model, serve, tmp_path) -> None:
    """After a miss and a hit, the replica's and the router's /metrics, scraped with the stack's
    admin key as Prometheus scrapes them, hold every series name the Grafana dashboard queries."""
    queried = queried_metrics()
    paths = scrape_paths()
    assert set(paths) == {"replica", "router"} and len(queried) >= 20
    key_file = tmp_path / "admin_key"
    key_file.write_text("a-generated-key\n")
    scrape = {"Authorization": "Bearer a-generated-key"}
    keyed = settings.model_copy(update={"allow_anonymous_admin": False} | keys_of("proxy", key_file))
    keyed = type(keyed)(**keyed.model_dump())  # NOTE: validated again, so the key is read from its file
    with serve(keyed, tiny_model) as server:
        api = Api(server)
        prompt = random_tokens(300, seed=1601)
        assert api.complete(prompt).cached_tokens == 0
        api.flush()
        assert api.complete(prompt).cached_tokens == 299  # two blocks and the tail
        route = RouteSettings(
            upstream=f"{server.base_url}/v1",
            redis_url=settings.redis_url,
            key_prefix=f"{settings.key_prefix}route:",
            **keys_of("router", key_file),
        )
        with ServerThread(create_route_app(route, Identity(tiny_model.tokenizer, "tiny"))) as router:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
            assert httpx.post(f"{router.base_url}/v1/completions", json=body, timeout=120).status_code == 200
            router_page = httpx.get(f"{router.base_url}{paths['router']}", headers=scrape, timeout=30)
        replica_page = httpx.get(f"{server.base_url}{paths['replica']}", headers=scrape, timeout=30)
    assert (replica_page.status_code, router_page.status_code) == (200, 200)
    families = {f.name: f for f in text_string_to_metric_families(replica_page.text)}
    ttft = {s.labels.get("cache") for s in families["kvproxy_time_to_first_token_seconds"].samples}
    assert {"hit", "miss"} <= ttft
    available = exported(replica_page.text) | exported(router_page.text)
    missing = {name: sorted(titles) for name, titles in queried.items() if name not in available}
    assert not missing, f"the dashboard queries series kvproxy does not export: {missing}"
