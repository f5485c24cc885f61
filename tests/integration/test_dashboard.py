"""The dashboard in headless Chromium: it renders, and the figures it shows are /stats'."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import httpx
import pytest

from tests.api import Api
from tests.helpers import random_tokens

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, timeout: float = 120) -> str:
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


def test_dashboard_shows_the_stats(settings, tiny_model, serve, tmp_path) -> None:
    """Traffic with hits and misses; the page's figures equal /stats; a screenshot is taken."""
    with serve(settings, tiny_model) as server:
        api = Api(server)
        prompt = random_tokens(300, seed=401)
        api.complete(prompt)
        api.flush()
        api.complete(prompt)
        api.complete(prompt[:200] + random_tokens(150, seed=402))
        api.flush()
        dom = chromium("--dump-dom", f"{server.base_url}/dashboard")
        stats = httpx.get(f"{server.base_url}/stats").json()
        shot = tmp_path / "dashboard.png"
        chromium("--window-size=1200,1000", f"--screenshot={shot}", f"{server.base_url}/dashboard")
    assert 'data-loaded="1"' in dom
    shown = dict(re.findall(r'data-field="([\w.]+)"[^>]*data-value="([^"]*)"', dom))
    assert len(shown) >= 14
    for field, raw in shown.items():
        value = stats
        for part in field.split("."):
            value = value[part]
        assert json.loads(raw.replace("&quot;", '"')) == value, field
    assert shown["deployment.cached_tokens"] == str(256 + 128)
    assert "never seen" in dom  # the recent misses table
    assert shot.stat().st_size > 10_000
