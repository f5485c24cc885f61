"""The router loads no model: ``kvproxy route`` (its app, its tokenizer) and ``kvproxy --help``
import no torch, safetensors or boto3, checked in fresh processes on ``sys.modules``
(``lint-imports`` checks the same statically)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import build_tiny_model

HEAVY = ("torch", "safetensors", "boto3")
REPORT = f"import json, sys; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"


def loaded_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\n{REPORT}"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_router_app_imports_no_heavy_package() -> None:
    """Importing the router's app module loads none of them."""
    assert loaded_after("import proxy.router.app") == []


def test_the_command_line_help_imports_no_heavy_package() -> None:
    """``kvproxy --help`` and ``kvproxy route --help`` load none of them."""
    for args in (["--help"], ["route", "--help"]):
        code = f"from proxy.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass"
        assert loaded_after(code) == []


def test_the_router_loads_its_tokenizer_without_torch(tmp_path: Path) -> None:
    """``--tokenizer DIR``: the router renders chats with the checkpoint's tokenizer, still without
    torch (a fast tokenizer, not AutoTokenizer)."""
    path = build_tiny_model(tmp_path / "tiny")
    code = (
        "from proxy.router.settings import RouteSettings\n"
        "from proxy.router.app import load_identity\n"
        f"s = RouteSettings(upstream='http://127.0.0.1:1/v1', tokenizer={str(path)!r},\n"
        f"    cache_dir={str(tmp_path)!r})\n"
        "identity = load_identity(s)\n"
        "body = {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}\n"
        "key = identity.prompt('chat', body, 't')\n"
        "assert key.block_size == 128 and key.prompt_tokens > 3, key"
    )
    assert loaded_after(code) == []
