"""docker-compose.yml, run for real: the image built once, the stack started on free local ports,
chats through the router and both replicas, one cache shared by the replicas, the admin key, the
Prometheus targets, the key and the cache kept across ``restart`` and ``down``/``up``, a killed
replica routed around, and nothing left behind by ``down -v``.

Runs wherever a Docker daemon and the compose v2 plugin answer, skipped elsewhere (``pytest -m
compose -s`` runs it alone and prints the build and start times): it took 5 to 12 minutes on a
shared 2-core machine with the image's layers cached (a first build adds about 5).
Grafana is left out (a profile); a CPU wheel of torch is put in ``deploy/wheels/`` only where
PyTorch's CPU index does not answer, and removed afterwards.
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import yaml

from tests.helpers import free_port

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3 * 3600)]

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "deploy" / "wheels"
TORCH = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu/torch/"
MODEL = "smollm2-135m-instruct"
PUBLISHED = {"proxy": 8000, "proxy-2": 8000, "router": 8080, "prometheus": 9090}
"""The services the test reaches from the host, by their container ports."""
REPLICAS = ("proxy", "proxy-2")
KEY_FILE = "/run/kvproxy/admin_key"
# NOTE: real prose that ships with Python (as in test_default_model.py): several 128-token blocks
PROSE = inspect.getdoc(argparse)
T = TypeVar("T")


def until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll ``condition`` every second until it returns something truthy (returned). NOTE: a bound
    on a hang, never a speed: a slow machine only waits longer."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(1)
    return result


def docker_missing() -> str | None:
    """Why the stack cannot run here (no docker command, no daemon, no compose v2), or None."""
    if shutil.which("docker") is None:
        return "no docker command"
    for command, what in (
        (["docker", "info"], "Docker daemon"),
        (["docker", "compose", "version"], "compose v2"),
    ):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return f"no {what} answers `{' '.join(command)}` (timed out)"
        if done.returncode != 0:
            return f"no {what} answers `{' '.join(command)}`: {done.stderr.strip()[-300:]}"
    return None


def docker_volumes() -> set[str]:
    listed = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


def torch_wheel() -> tuple[str | None, Path | None]:
    """The build's ``TORCH_INSTALL``: None (the Dockerfile's default, PyTorch's CPU index) where
    that index answers; else the CPU wheel ``pip download`` fetches here, put in deploy/wheels/.
    Also the wheel this put there (to remove afterwards), None if it was there already."""
    try:
        httpx.head(TORCH_CPU_INDEX, timeout=15, follow_redirects=True).raise_for_status()
        return None, None
    except httpx.HTTPError:
        pass
    before = set(WHEELS.glob("torch-*.whl"))
    # NOTE: for the image's Python (3.11), whatever this interpreter is
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    download += ["--python-version", "3.11", "-d", str(WHEELS), TORCH]
    subprocess.run(download, check=True, timeout=1800)
    (wheel,) = {w for w in WHEELS.glob("torch-*.whl") if "-cp311-" in w.name}
    if "+cpu" not in wheel.name:
        if wheel not in before:
            wheel.unlink()
        pytest.skip(f"PyTorch's CPU index does not answer and pip fetches no CPU build here ({wheel.name})")
    return f"/tmp/wheels/{wheel.name}", None if wheel in before else wheel


@dataclass
class Stack:
    """One compose project of docker-compose.yml, its published ports remapped to free ones."""

    project: str
    override: Path
    ports: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout_s: float = 1800, check: bool = True) -> str:
        """Run ``docker compose <args>`` on this project; its output. A failure says what the
        services logged last."""
        files = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(self.override)]
        command = ["docker", "compose", "-p", self.project, *files, *args]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            logs = subprocess.run(
                [*command[: 3 + len(files)], "logs", "--no-color", "--tail", "30"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {done.returncode}:\n"
                f"{(done.stdout + done.stderr)[-4000:]}\n--- logs ---\n{logs.stdout[-6000:]}"
            )
        return done.stdout

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def key(self) -> str:
        """The admin key the `keys` service wrote, as the compose header says to read it."""
        return self.compose("exec", "-T", "proxy", "cat", KEY_FILE).strip()

    def timed(self, what: str, *args: str) -> None:
        started = time.monotonic()
        self.compose(*args)
        self.wait_ready()
        self.timings[what] = time.monotonic() - started
        print(f"compose: {what}: {self.timings[what]:.0f} s")

    def wait_ready(self, timeout_s: float = 1800) -> None:
        """Both replicas and the router answer /health with every replica up; Prometheus is ready."""

        def ready() -> bool:
            try:
                replicas = [httpx.get(f"{self.url(s)}/health", timeout=5) for s in REPLICAS]
                router = httpx.get(f"{self.url('router')}/health", timeout=5)
                prometheus = httpx.get(f"{self.url('prometheus')}/-/ready", timeout=5)
            except httpx.HTTPError:
                return False
            answered = [*replicas, router, prometheus]
            return all(r.status_code == 200 for r in answered) and all(router.json()["replicas"].values())

        until(ready, timeout_s, "the replicas, the router and Prometheus to be ready")


def override_file(path: Path, ports: dict[str, int], torch_install: str | None) -> Path:
    """The test's compose override: free host ports on 127.0.0.1 (8000 may be taken here), Grafana
    behind a profile (no image of it is needed), the build's torch source if not the default."""
    lines = ["services:"]
    for service, port in ports.items():
        lines += [f"  {service}:", f'    ports: !override ["127.0.0.1:{port}:{PUBLISHED[service]}"]']
    lines += ["  grafana:", '    profiles: ["grafana"]']
    if torch_install is not None:
        lines += ["  model:", "    build:", "      args:", f'        TORCH_INSTALL: "{torch_install}"']
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack built and started once for this module; ``down -v`` afterwards, whatever happened."""
    if (missing := docker_missing()) is not None:
        pytest.skip(missing)
    torch_install, placed = torch_wheel()
    ports = {service: free_port() for service in PUBLISHED}
    override = override_file(tmp_path_factory.mktemp("compose") / "override.yml", ports, torch_install)
    stack = Stack(f"kvproxy-test-{uuid.uuid4().hex[:8]}", override, ports)
    try:
        started = time.monotonic()
        stack.compose("build", timeout_s=3 * 3600)
        stack.timings["build"] = time.monotonic() - started
        print(f"compose: build (one image, kvproxy:local): {stack.timings['build']:.0f} s")
        stack.timed("first start (up -d until all ready)", "up", "-d")
        yield stack
    finally:
        stack.compose("down", "-v", "--remove-orphans", check=False)
        if placed is not None:
            placed.unlink(missing_ok=True)


def chat(url: str, system: str, question: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply


def cached(reply: httpx.Response) -> int:
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def new_system_prompt() -> str:
    """A system prompt no earlier request sent (a nonce first), several blocks long."""
    return f"Session {uuid.uuid4().hex}.\n\n{PROSE}"


def system_only(system: str) -> dict[str, object]:
    """A body naming the system prompt alone, as the start of a chat (no generation prompt)."""
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}],
        "add_generation_prompt": False,
    }


def system_tokens(url: str, system: str) -> int:
    """The tokens of ``system`` as the start of a chat prompt (a tail is stored where it ends)."""
    reply = httpx.post(f"{url}/tokenize", json=system_only(system), timeout=120)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["count"])


def cache_through(url: str, system: str) -> int:
    """Chat under ``system`` through the replica at ``url`` (a miss); the system prompt's tokens.

    NOTE: a prewarm of the system prompt on the same replica answers once that replica's saves,
    the chat's among them, are indexed: no sleep, no race with the next request."""
    assert cached(chat(url, system, "Summarize this in one sentence.")) == 0
    prewarm = httpx.post(f"{url}/v1/cache/prewarm", json=system_only(system), timeout=600)
    assert prewarm.status_code == 200, prewarm.text
    return system_tokens(url, system)


def service_of(replica_url: str) -> str:
    """``http://proxy-2:8000/v1`` (the router's name of a replica) -> ``proxy-2``."""
    return httpx.URL(replica_url).host


def test_chat_through_the_router_and_both_replicas(stack: Stack) -> None:
    """Each of the three endpoints answers a chat; the router names the replica it chose."""
    system = new_system_prompt()
    for service in ("router", *REPLICAS):
        reply = chat(stack.url(service), system, "What is the capital of France?")
        assert reply.json()["choices"][0]["message"]["content"], service
        if service == "router":
            assert service_of(reply.headers["x-kvproxy-replica"]) in REPLICAS


def test_a_prefix_cached_through_one_replica_hits_on_the_other(stack: Stack) -> None:
    """Both ways: a system prompt cached through one replica is served from the cache to the
    other, every one of its tokens (its blocks, then the tail stored where it ends)."""
    for first, other in (REPLICAS, REPLICAS[::-1]):
        system = new_system_prompt()
        tokens = cache_through(stack.url(first), system)
        assert tokens > 2 * 128
        assert cached(chat(stack.url(other), system, "Which class parses the arguments?")) == tokens


def test_the_admin_key_gates_metrics_and_cache_stats(stack: Stack) -> None:
    """The key the `keys` service wrote: without it (or with another) 401, with it 200, on the
    replicas' /metrics and /v1/cache/stats and the router's /metrics and /stats; the router has
    no /v1/cache/* routes."""
    key = stack.key()
    assert len(key) >= 32
    gated = [(s, path) for s in REPLICAS for path in ("/metrics", "/v1/cache/stats")]
    gated += [("router", "/metrics"), ("router", "/stats")]
    for service, path in gated:
        url = f"{stack.url(service)}{path}"
        for bearer, status in ((None, 401), ("not-the-key", 401), (key, 200)):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            assert httpx.get(url, headers=headers, timeout=30).status_code == status, (service, path, bearer)
    router_cache = httpx.get(
        f"{stack.url('router')}/v1/cache/stats", headers={"Authorization": f"Bearer {key}"}
    )
    assert router_cache.status_code == 404


def test_prometheus_scrapes_all_three_targets(stack: Stack) -> None:
    """Both replicas (job kvproxy) and the router (job kvproxy-router) are up, scraped with the key."""

    def targets() -> dict[tuple[str, str], str] | None:
        reply = httpx.get(f"{stack.url('prometheus')}/api/v1/targets", timeout=30).json()
        found = {
            (t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in reply["data"]["activeTargets"]
        }
        return found if set(found.values()) == {"up"} else None

    found = until(targets, 300, "every Prometheus target to be up")
    assert set(found) == {
        ("kvproxy", "proxy:8000"),
        ("kvproxy", "proxy-2:8000"),
        ("kvproxy-router", "router:8080"),
    }


def kept_across(stack: Stack, what: str, *steps: tuple[str, ...]) -> None:
    """After ``steps`` (compose commands), the admin key is the same and a system prompt cached
    before is served from the cache on both replicas, the one it did not go through first."""
    key, system = stack.key(), new_system_prompt()
    tokens = cache_through(stack.url("proxy"), system)
    started = time.monotonic()
    for step in steps:
        stack.compose(*step)
    stack.wait_ready()
    stack.timings[what] = time.monotonic() - started
    print(f"compose: {what}: {stack.timings[what]:.0f} s until all ready")
    assert stack.key() == key
    # NOTE: questions that differ from their first token: neither hits what the other stored
    for service, question in (("proxy-2", "Why parse arguments?"), ("proxy", "How are options named?")):
        assert cached(chat(stack.url(service), system, question)) == tokens, service


def test_the_key_and_the_cache_survive_a_restart(stack: Stack) -> None:
    """`docker compose restart`: the keys volume, the Redis append-only file and the blob volume."""
    kept_across(stack, "restart", ("restart",))


def test_the_key_and_the_cache_survive_down_and_up(stack: Stack) -> None:
    """`docker compose down` (no -v) and `up -d`: new containers on the same named volumes."""
    kept_across(stack, "down and up", ("down",), ("up", "-d"))


def test_a_killed_replica_is_routed_around(stack: Stack) -> None:
    """The replica that holds a prompt's prefix is killed: the router answers that prompt's next
    turns from the other, and its /health marks the dead one down."""
    system = new_system_prompt()
    victim = service_of(chat(stack.url("router"), system, "What is a parser?").headers["x-kvproxy-replica"])
    (survivor,) = set(REPLICAS) - {victim}
    stack.compose("kill", victim)
    for question in ("What is a subparser?", "What is an argument group?", "What is a namespace?"):
        reply = chat(stack.url("router"), system, question)
        assert service_of(reply.headers["x-kvproxy-replica"]) == survivor, reply.headers

    def marked_down() -> bool:
        health = httpx.get(f"{stack.url('router')}/health", timeout=5).json()["replicas"]
        return {service_of(url): up for url, up in health.items()} == {victim: False, survivor: True}

    until(marked_down, 120, f"the router's /health to mark {victim} down")


def project_volumes(project: str) -> tuple[set[str], set[str]]:
    """The volumes compose labelled as ``project``'s, and those its containers mount (a VOLUME of
    the image becomes an anonymous one there). NOTE: by the project, not by what appeared since the
    test began: another stack may be up on the same daemon meanwhile."""
    labelled = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    containers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    mounted = (
        subprocess.run(
            [
                "docker",
                "inspect",
                "-f",
                '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}',
                *containers,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if containers
        else []
    )
    return set(labelled), set(mounted)


def test_down_v_leaves_no_volume_behind(stack: Stack) -> None:
    """The stack made its named volumes only (its containers mount no anonymous one: no image
    VOLUME), and `down -v` removes them all."""
    named = {
        f"{stack.project}_{name}"
        for name in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["volumes"]
    }
    labelled, mounted = project_volumes(stack.project)
    assert labelled == named and mounted <= named, (labelled, mounted)
    stack.compose("down", "-v", "--remove-orphans")
    assert project_volumes(stack.project) == (set(), set())
    assert not named & docker_volumes()
    print("compose: " + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in stack.timings.items()))
