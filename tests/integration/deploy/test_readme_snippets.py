"""Every code block of README.md runs as a reader runs it, against a real server (the tiny model
served as ``smollm2-135m-instruct``): Python blocks in a fresh interpreter, shell blocks in bash,
their URLs pointed at the test's server; each block's output shows what its comments promise.
Blocks that install or start servers are exempt, each naming the test that covers it instead; a
block that is neither run here nor exempt fails the suite."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hashing import BLOCK_SIZE
from tests.api import Api
from tests.helpers import random_tokens

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", README, flags=re.M | re.S)
QUICKSTART = "http://127.0.0.1:8000"  # the server the snippets talk to, as after the quickstart
NEW_HOST = "http://new-host:8000"  # the snapshot block's second deployment
MODEL = "smollm2-135m-instruct"

RUN = {  # a string only that block holds -> the test below that runs it
    "What is the capital of France?": "test_chat_snippet_hits_on_its_second_call",
    "curl -N": "test_curl_snippet_streams_with_usage",
    "anthropic.Anthropic(": "test_messages_snippet_reads_the_document_from_the_cache",
    "gemini.caches.create": "test_named_cache_snippet_serves_gemini_and_openai",
    "previous_response_id": "test_responses_snippet_continues_from_the_cache",
    "kvproxy cache stats": "test_cache_commands_snippet_empties_the_cache",
    "kvproxy cache export": "test_snapshot_snippet_moves_the_cache",
}
EXEMPT = {  # blocks that install or start servers -> what runs them instead
    "&& kvproxy serve": "tests/integration/deploy/test_wheel.py",  # installs the wheel, serves a chat
    "&& pytest": ".ci/run",  # the README's test command (tests/unit/deploy/test_readme.py)
    "kvproxy route --upstream": "tests/integration/router/test_route.py",
}
CLIENTS = {"openai": "openai", "anthropic": "anthropic", "google": "google-genai"}


def block(marker: str) -> str:
    (code,) = [code for _, code in BLOCKS if marker in code]
    return code


def pointed_at(code: str, server, new_host=None) -> str:
    """The block with its URLs rewritten to the test's servers (never a real port 8000)."""
    assert QUICKSTART in code
    code = code.replace(QUICKSTART, server.base_url)
    if new_host is not None:
        code = code.replace(NEW_HOST, new_host.base_url)
    assert ":8000" not in code, code
    return code


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a block as a reader's shell would, with this interpreter's scripts (``kvproxy``) first on
    the PATH and none of the developer's ``KVPROXY_*`` variables; its stdout."""
    scripts = str(Path(sys.executable).parent)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVPROXY_")}
    base["PATH"] = f"{scripts}{os.pathsep}{base.get('PATH', '')}"
    done = subprocess.run(argv, cwd=cwd, env=base | (env or {}), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout


def python(code: str, cwd: Path) -> str:
    return run([sys.executable, "-c", code], cwd)


def bash(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return run(["bash", "-euo", "pipefail", "-c", code], cwd, env)


def json_documents(text: str) -> list:
    """Every JSON value printed one after another (indented or not)."""
    decoder, found, rest = json.JSONDecoder(), [], text.strip()
    while rest:
        value, end = decoder.raw_decode(rest)
        found.append(value)
        rest = rest[end:].lstrip()
    return found


@pytest.fixture
def server(settings, tiny_model, serve):
    with serve(settings.model_copy(update={"served_model_name": MODEL}), tiny_model) as running:
        yield running


def test_every_block_is_run_or_exempt() -> None:
    """Each code block holds exactly one marker of RUN (run by the named test) or EXEMPT (covered by
    the named file), and each marker names exactly one block: a new block fails until it is one."""
    tests = {name for name in globals() if name.startswith("test_")}
    for marker, test in RUN.items():
        assert test in tests, marker
    for marker, covered_by in EXEMPT.items():
        assert (ROOT / covered_by).is_file(), marker
    fences = re.findall(r"^[ \t]*(?:```|~~~)", README, flags=re.M)
    assert len(fences) == 2 * len(BLOCKS), "a fenced block this test does not read (indented? ~~~?)"
    for language, code in BLOCKS:
        found = [m for m in (*RUN, *EXEMPT) if m in code]
        assert len(found) == 1, f"a README {language or 'plain'} block no test runs or exempts:\n{code}"
    for marker in (*RUN, *EXEMPT):
        assert sum(marker in code for _, code in BLOCKS) == 1, marker


def test_python_blocks_need_only_the_clients_the_readme_installs() -> None:
    """Every Python block parses and imports only the standard library and the clients of the
    README's one install line (``pip install openai anthropic google-genai``)."""
    install = re.search(r"`pip install ((?:[a-z-]+ ?)+)`", README.split("```python", 1)[0])
    assert install is not None and set(install.group(1).split()) == set(CLIENTS.values())
    for language, code in BLOCKS:
        if language != "python":
            continue
        for node in ast.walk(ast.parse(code)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names):
                assert top in CLIENTS, f"{top} is not installed by the README:\n{code}"


def test_chat_snippet_hits_on_its_second_call(server, tmp_path) -> None:
    """The same question twice: 0 of n prompt tokens cached, then n - 1 of n."""
    out = python(pointed_at(block("What is the capital of France?"), server), tmp_path)
    (first, n), (again, m) = (
        tuple(map(int, re.search(rf"^{attempt} (\d+) of (\d+)$", out, flags=re.M).groups()))
        for attempt in ("first", "again")
    )
    assert (first, again, m) == (0, n - 1, n)


def test_curl_snippet_streams_with_usage(server, tmp_path) -> None:
    """Server-sent chunks of the chat route, then one with the usage (at most 100 completion
    tokens), then [DONE]."""
    lines = [line for line in bash(pointed_at(block("curl -N"), server), tmp_path).splitlines() if line]
    assert len(lines) > 2 and all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert {(c["object"], c["model"]) for c in chunks} == {("chat.completion.chunk", MODEL)}
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and 0 < usage["completion_tokens"] <= 100


def test_messages_snippet_reads_the_document_from_the_cache(server, tmp_path) -> None:
    """Two questions on one long system document under a 1h breakpoint: the first stores it (as
    1h tokens) and reads nothing, the second reads its blocks."""
    out = python(pointed_at(block("anthropic.Anthropic("), server), tmp_path)
    reads = [int(n) for n in re.findall(r"cache_read_input_tokens=(\d+)", out)]
    stored_1h = [int(n) for n in re.findall(r"ephemeral_1h_input_tokens=(\d+)", out)]
    assert len(reads) == 2 and reads[0] == 0 and reads[1] >= BLOCK_SIZE, out
    assert stored_1h[0] >= BLOCK_SIZE, out


def test_named_cache_snippet_serves_gemini_and_openai(server, tmp_path) -> None:
    """A named cache of the document answers Gemini's client and OpenAI's (cached_content) from its
    blocks; the snippet deletes it at the end."""
    out = python(pointed_at(block("gemini.caches.create"), server), tmp_path)
    gemini_cached, openai_cached = (int(line) for line in out.splitlines()[:2])
    assert gemini_cached >= BLOCK_SIZE and openai_cached >= BLOCK_SIZE, out
    listed = httpx.get(f"{server.base_url}/v1beta/cachedContents", timeout=30).json()
    assert listed.get("cachedContents", []) == []


def test_responses_snippet_continues_from_the_cache(server, tmp_path) -> None:
    """previous_response_id: the second turn's cached tokens cover the whole first turn."""
    out = python(pointed_at(block("previous_response_id"), server), tmp_path)
    first_turn, cached = (int(n) for n in out.splitlines()[0].split())
    assert cached >= first_turn > 0, out


def test_cache_commands_snippet_empties_the_cache(settings, tiny_model, serve, tmp_path) -> None:
    """stats, gc and clear located by the server's settings (as KVPROXY_* variables): stats counts
    the cached prompt's blocks and tail, gc finds nothing to reclaim, clear removes them all, and
    the prompt is a miss again."""
    quiet = settings.model_copy(update={"served_model_name": MODEL, "no_render_ahead": True})
    prompt = random_tokens(300, seed=7)  # 2 blocks and a tail
    with serve(quiet, tiny_model) as running:
        api = Api(running, model=MODEL)
        api.complete(prompt)
        api.flush()
        env = {
            "KVPROXY_REDIS_URL": settings.redis_url,
            "KVPROXY_KEY_PREFIX": settings.key_prefix,
            "KVPROXY_BLOB_DIR": str(settings.blob_dir),
            "KVPROXY_CACHE_DIR": str(settings.cache_dir),
        }
        stats, collected, cleared = json_documents(bash(block("kvproxy cache stats"), tmp_path, env))
        assert stats["blocks"] >= 3 and collected["unindexed_blobs"] == 0
        assert cleared == {"removed_blocks": stats["blocks"], "removed_named_caches": 0}
        assert api.complete(prompt).cached_tokens == 0


def test_snapshot_snippet_moves_the_cache(settings, tiny_model, serve, tmp_path) -> None:
    """Export every block from one server and import it into a new deployment (its own key prefix
    and blob directory), with the admin key the snippet exports: the prompt is a hit there."""
    code = block("kvproxy cache export")
    admin_key = re.search(r"KVPROXY_API_KEY=(\S+)", code).group(1)
    keyed = settings.model_copy(update={"served_model_name": MODEL, "admin_key": admin_key})
    new = keyed.model_copy(update={"key_prefix": settings.key_prefix + "new:", "blob_dir": tmp_path / "new"})
    prompt = random_tokens(300, seed=8)  # 2 blocks
    with serve(keyed, tiny_model) as old, serve(new, tiny_model) as fresh:
        Api(old, model=MODEL).complete(prompt)
        Api(old).flush()
        exported, report = json_documents(bash(pointed_at(code, old, new_host=fresh), tmp_path))
        assert exported["blocks"] == 2 and exported["skipped"] == 0
        assert (report["imported"], report["rejected"]) == (2, [])
        assert Api(fresh, model=MODEL).complete(prompt).cached_tokens == 2 * BLOCK_SIZE
