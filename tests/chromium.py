"""Headless Chromium, for the tests that read a dashboard as a browser renders it (Debian's
``chromium``; skipped without it, a failure in CI)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, timeout: float = 120) -> str:
    """Headless Chromium run with ``args``; its standard output (with ``--dump-dom``, the page as
    rendered once its scripts ran)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs Chromium for the dashboard test: apt-get install chromium")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--virtual-time-budget=5000",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout, check=True
    ).stdout
