"""Servers for side-by-side runs, started on local ports and awaited: ``kvproxy serve`` and its
peer, llama-cpp-python's OpenAI-compatible server (in a virtualenv of its own); ``kvproxy route``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def serve(port: int, blob_dir: Path, prefix: str, *flags: str) -> subprocess.Popen[bytes]:
    """``kvproxy serve`` on ``port`` with its own blob directory (unless ``flags`` give
    ``--blob-url``) and key prefix, once it answers."""
    env = os.environ | {"KVPROXY_PORT": str(port), "KVPROXY_KEY_PREFIX": prefix}
    if "--blob-url" not in flags:
        env["KVPROXY_BLOB_DIR"] = str(blob_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _awaited(proc, f"http://127.0.0.1:{port}/health")


def route(port: int, upstreams: list[str], *flags: str) -> subprocess.Popen[bytes]:
    """``kvproxy route`` on ``port`` in front of ``upstreams`` (OpenAI base URLs), once it answers."""
    command = [
        sys.executable,
        "-m",
        "proxy.cli",
        "route",
        "--port",
        str(port),
        "--upstream",
        ",".join(upstreams),
    ]
    proc = subprocess.Popen([*command, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _awaited(proc, f"http://127.0.0.1:{port}/health")


def use_s3(endpoint: str, bucket: str) -> None:
    """Point this process and the servers it starts at the S3 endpoint ``endpoint`` (moto's local
    server: any credentials pass), and make ``bucket`` there."""
    import boto3

    os.environ |= {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client("s3").create_bucket(Bucket=bucket)


def serve_llama_cpp(
    port: int, python: str, gguf: Path, threads: int = 2, drafts: bool = False
) -> subprocess.Popen[bytes]:
    """llama-cpp-python's server (``python -m llama_cpp.server``) on the GGUF file, with its RAM
    prompt cache on, once it answers.

    Args:
        python: the interpreter of the virtualenv holding ``llama-cpp-python[server]``.
        drafts: with its own speculation, prompt-lookup drafts of 10 tokens (its default).
    """
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", str(threads)]
    command += ["--cache", "true", "--cache_type", "ram", "--n_ctx", "8192", "--port", str(port)]
    if drafts:
        command += ["--draft_model", "prompt-lookup-decoding"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _awaited(proc, f"http://127.0.0.1:{port}/v1/models")


@contextlib.contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Stop the server at the end of the block."""
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _awaited(proc: subprocess.Popen[bytes], url: str) -> subprocess.Popen[bytes]:
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{url} did not answer")
