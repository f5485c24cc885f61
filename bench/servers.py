"""Servers for side-by-side runs: ``kvproxy serve`` processes on local ports, started and awaited."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


def serve(port: int, blob_dir: Path, prefix: str, *flags: str) -> subprocess.Popen:
    env = os.environ | {
        "KVPROXY_PORT": str(port),
        "KVPROXY_BLOB_DIR": str(blob_dir),
        "KVPROXY_KEY_PREFIX": prefix,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError(f"kvproxy on port {port} did not start")
