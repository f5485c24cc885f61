"""What users install: the built wheel, installed (not editable) into a fresh virtualenv, serves a
chat request; every file the code reads at run time is in it, and a kernel source that is gone
costs the native decode step, never the server."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("hashing", "store", "engine", "proxy", "bench")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(ROOT), "-w", str(out)],
        check=True,
        cwd=out,
    )
    (built,) = out.glob("kvproxy-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (no system site-packages) holding the wheel and its dependencies."""
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    # NOTE: torch pinned as the README installs it (the CPU build this kind of machine carries)
    subprocess.run(
        [env / "bin" / "pip", "install", "--quiet", "torch==2.13.0", str(wheel)], check=True, cwd=env
    )
    return env


def package_data() -> set[str]:
    """The files under the packages that are not Python, as git tracks them."""
    listed = subprocess.run(
        ["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {name for name in listed if not name.endswith(".py")}


def test_the_wheel_holds_every_file_the_packages_read(wheel: Path) -> None:
    """Every tracked non-Python file of the packages (the kernel source, the dashboards) ships."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    wanted = package_data()
    assert "engine/kernels/decode.cpp" in wanted
    assert wanted <= names, f"missing from the wheel: {sorted(wanted - names)}"


@pytest.fixture
def kernel_source(venv: Path) -> Iterator[Path]:
    """The installed kernel source; put back after a test that removes it."""
    (source,) = (venv / "lib").glob("python*/site-packages/engine/kernels/decode.cpp")
    kept = source.read_bytes()
    yield source
    source.write_bytes(kept)


def serve_one_chat(venv: Path, model_dir: str, tmp_path: Path) -> str:
    """Start the installed ``kvproxy serve`` (a fresh cache directory, so the kernel is built from
    the installed source, and the index is the embedded one the wheel's dependencies bring), send
    one chat twice (the second a hit), stop it; the server's log."""
    port, log = free_port(), tmp_path / "serve.log"
    command = [
        venv / "bin" / "kvproxy", "serve", "--model", model_dir, "--port", str(port),
        "--cache-dir", str(tmp_path / "cache"), "--served-model-name", "tiny",
    ]  # fmt: skip
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url, server), timeout_s=300, what=f"the installed server ({log})")
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for hit in (False, True):
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            usage = reply.json()["usage"]
            assert usage["completion_tokens"] >= 1
            assert (usage["prompt_tokens_details"]["cached_tokens"] > 0) == hit, usage
    finally:
        server.terminate()
        server.wait(60)
    return log.read_text()


def _up(url: str, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, f"the server exited with status {server.returncode}"
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_installed_wheel_serves_with_the_native_step(venv: Path, tiny_model, tmp_path: Path) -> None:
    """Installed from the wheel, the server builds its native decode step and answers."""
    log = serve_one_chat(venv, tiny_model.model.name_or_path, tmp_path)
    assert "decode step: native" in log, log
    assert "index: embedded Valkey (started) on " in log, log
    assert f"data in {tmp_path / 'cache' / 'index'} (--redis-url" in log, log


def test_without_the_kernel_source_it_decodes_with_torch(
    venv: Path, kernel_source: Path, tiny_model, tmp_path: Path
) -> None:
    """A missing kernel source is one log line, naming why and the step decoding instead; the chat
    answers."""
    kernel_source.unlink()
    log = serve_one_chat(venv, tiny_model.model.name_or_path, tmp_path)
    said = [line for line in log.splitlines() if "cannot read its source decode.cpp" in line]
    assert len(said) == 1, log
    assert re.search(r"WARNING .*decode step: (lean|transformers' forward)", said[0]), said
