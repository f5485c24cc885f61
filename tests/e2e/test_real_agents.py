"""Claude Code and Codex CLI, installed from npm, run against ``kvproxy serve`` on Gemma 3 270M
(32k context) with only a base URL, a key and the model name set: ``python -m bench.agents``, the
check issue 46's acceptance asks for (docs/agents.md). Every request is answered (a context-limit
error the agent recovers from aside), a new session and a resumed one each reuse at least 90 % of
their first answered prompt, and the agents make tool calls.

Skipped without npm, without the agents (on PATH, or in the npm prefix that
``KVPROXY_AGENTS_NPM_PREFIX`` names: ``npm i --prefix DIR @openai/codex @anthropic-ai/claude-code``),
or without the model already fetched into the kvproxy cache directory (``kvproxy serve --model
gemma3-270m`` fetches it once): CI has none of them. Each agent session is cut after seven minutes
(a 270M model may call tools without end); the resumed session takes up where the cut one ended.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.agents.clients import AGENTS
from engine.model.fetch import KNOWN_MODELS, is_checkpoint
from proxy.config import default_cache_dir

GEMMA = "gemma3-270m"
ROOT = Path(__file__).resolve().parents[2]
# NOTE: a cut, not an expectation: the session's requests so far are what is checked. A cold
# 19.6k-token Claude Code prompt took 254 s on a loaded 2-core machine; the cut leaves it room.
SESSION_S = 420


def _missing(agent: str) -> str | None:
    """Why ``agent``'s check cannot run here, or None."""
    if shutil.which("npm") is None:
        return "npm is not installed"
    prefix = os.environ.get("KVPROXY_AGENTS_NPM_PREFIX")
    search = [Path(prefix) / "node_modules" / ".bin"] if prefix else []
    if AGENTS[agent].find(search) is None:
        return f"{AGENTS[agent].package} is not installed (on PATH or in KVPROXY_AGENTS_NPM_PREFIX)"
    if GEMMA not in KNOWN_MODELS:
        return f"{GEMMA} is not a known model of this kvproxy"
    cache_dir = Path(os.environ.get("KVPROXY_CACHE_DIR", default_cache_dir()))
    if not is_checkpoint(cache_dir / "models" / GEMMA):
        return f"{GEMMA} is not fetched into {cache_dir / 'models'} (kvproxy serve --model {GEMMA} does it)"
    return None


@pytest.mark.timeout(3 * SESSION_S + 900)
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_sessions_reuse_their_prompts(agent: str, tmp_path: Path) -> None:
    """A fresh session, a new one of the same kind and the last one resumed: no request refused,
    the new and resumed sessions' first prompts >= 90 % cached, tool calls made."""
    if reason := _missing(agent):
        pytest.skip(reason)
    prefix = os.environ.get("KVPROXY_AGENTS_NPM_PREFIX")
    out = tmp_path / "agents.json"
    command = [sys.executable, "-m", "bench.agents", "--agents", agent, "--model", GEMMA, "--pause-s", "0"]
    command += ["--session-timeout-s", str(SESSION_S), "--workdir", str(tmp_path / "run"), "--json", str(out)]
    command += ["--npm-prefix", prefix] if prefix else []
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    failed = [f"{c['name']}: {c['detail']}" for c in doc["checks"] if not c["passed"]]
    assert not failed, "\n".join(failed) + "\n" + run.stdout[-3000:]
    assert run.returncode == 0, run.stdout[-3000:]
