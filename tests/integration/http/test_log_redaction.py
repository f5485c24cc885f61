"""Secrets in query strings never reach the logs: the real ``kvproxy serve`` and ``kvproxy route``
(subprocesses, their own log configuration) answer requests carrying Gemini's ``?key=`` and other
secret parameters, and neither uvicorn's access log nor any other line shows them."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import httpx
import pytest

from tests.fake_upstream import fake_upstream
from tests.helpers import HANG_S, ServerThread, build_tiny_model, free_port

SECRET = "AIzaHunter2Secret"
QUERIES = [f"?key={SECRET}", f"?alt=sse&api_key={SECRET}", f"?access_token={SECRET}&x=1", f"?token={SECRET}"]


def logged(command: list[str], port: int) -> str:
    """Run ``kvproxy <command>`` on ``port``, send it requests carrying ``SECRET`` in their query,
    and return everything it wrote (stdout: the access log; stderr: the rest)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", *command, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        for query in QUERIES:
            httpx.get(f"http://127.0.0.1:{port}/v1beta/models{query}", timeout=30)
            httpx.post(
                f"http://127.0.0.1:{port}/v1beta/models/nope:generateContent{query}", json={}, timeout=30
            )
            httpx.get(f"http://127.0.0.1:{port}/v1/models{query}", timeout=30)
    finally:
        process.terminate()
        out, err = process.communicate(timeout=HANG_S)
    return out + err


@pytest.mark.parametrize("mode", ["serve", "route"])
def test_secret_query_parameters_never_reach_the_logs(mode, tmp_path) -> None:
    """Every request is in the access log, its secret parameters as ``***``."""
    if mode == "serve":
        model = build_tiny_model(tmp_path / "tiny")
        command = ["serve", "--model", str(model), "--cache-dir", str(tmp_path), "--redis-url", "memory://"]
        output = logged(command, free_port())
    else:
        with ServerThread(fake_upstream("a")) as upstream:
            command = ["route", "--upstream", f"{upstream.base_url}/v1", "--cache-dir", str(tmp_path)]
            output = logged([*command, "--redis-url", "memory://"], free_port())
    assert SECRET not in output, output[-3000:]
    for shown in ("?key=***", "api_key=***", "access_token=***&x=1", "?token=***"):
        assert shown in output, output[-3000:]


def test_a_line_of_kvproxys_own_and_its_traceback_are_redacted() -> None:
    """A URL or query in a message, its arguments or its exception's text is redacted; the
    record is kept."""
    from proxy.http.redact import RedactSecrets  # NOTE: here, so the file runs on code without it

    record = logging.LogRecord("route", logging.WARNING, __file__, 1, "replica %s said %s", None, None)
    record.args = (f"http://u:{SECRET}@h/v1", f"GET /v1beta/x?alt=sse&key={SECRET}")
    try:
        raise ValueError(f"bad url http://h/v1beta/x?key={SECRET}")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert RedactSecrets().filter(record)
    text = logging.Formatter().format(record)
    assert SECRET not in text and "http://u:***@h/v1" in text and "alt=sse&key=***" in text
