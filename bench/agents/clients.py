"""The agents under test, as their users run them: each is pointed at a server by its documented
base-URL setting, an API key and a model name, with its telemetry off and nothing else changed,
in a home directory of its own (so no user's settings or sessions leak in), and run
non-interactively.

Claude Code (npm ``@anthropic-ai/claude-code``): ``claude -p TASK``, resumed with
``claude -p --continue TASK``; ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_MODEL``,
and its documented switches for telemetry, error reports, the update check and other
non-essential traffic.

Codex CLI (npm ``@openai/codex``): ``codex exec TASK``, resumed with ``codex exec resume --last
TASK``; a ``config.toml`` in ``CODEX_HOME`` with ``model``, a model provider (``base_url``,
``env_key`` naming the key's variable), ``analytics.enabled = false`` and
``check_for_update_on_startup = false``.

Codex 0.171 no longer reads ``OPENAI_BASE_URL``; its built-in ``openai`` provider with
``openai_base_url`` would first try a WebSocket to the server. A provider entry of one's own speaks
the Responses API over HTTPS, which is what a local server serves.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

API_KEY = "sk-local-bench"  # NOTE: any key: a kvproxy started without --api-keys takes all


@dataclass(frozen=True)
class Agent:
    """One agent CLI: how to find it, and how to run a session of it against ``base_url``."""

    name: str
    binary: str
    package: str

    def find(self, search: list[Path]) -> str | None:
        """The executable: in one of ``search`` (``node_modules/.bin`` folders first), else on PATH."""
        for folder in search:
            candidate = folder / self.binary
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        return shutil.which(self.binary)

    def prepare(self, home: Path, base_url: str, model: str) -> dict[str, str]:
        """Write what the agent reads at start into ``home`` (its own), and return the environment
        variables that point it at ``base_url`` (the server's root URL, no ``/v1``)."""
        raise NotImplementedError

    def command(self, executable: str, task: str, resume: bool) -> list[str]:
        """The command line of a fresh session, or (``resume``) of the most recent one resumed."""
        raise NotImplementedError


class ClaudeCode(Agent):
    """Claude Code: the Messages API at ``ANTHROPIC_BASE_URL``."""

    def prepare(self, home: Path, base_url: str, model: str) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        return {
            "CLAUDE_CONFIG_DIR": str(home),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_MODEL": model,
            # NOTE: telemetry, error reports and the update check off: Claude Code's documented
            # switches (the last one covers the others and any other non-essential traffic)
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }

    def command(self, executable: str, task: str, resume: bool) -> list[str]:
        return [executable, "-p", *(["--continue"] if resume else []), task]


class Codex(Agent):
    """Codex CLI: the Responses API of a model provider in ``$CODEX_HOME/config.toml``."""

    def prepare(self, home: Path, base_url: str, model: str) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model = "{model}"\n'
            'model_provider = "kvproxy"\n'
            "check_for_update_on_startup = false\n\n"
            "[model_providers.kvproxy]\n"
            'name = "kvproxy"\n'
            f'base_url = "{base_url}/v1"\n'
            'env_key = "KVPROXY_API_KEY"\n\n'
            "[analytics]\n"
            "enabled = false\n"
        )
        return {"CODEX_HOME": str(home), "KVPROXY_API_KEY": API_KEY}

    def command(self, executable: str, task: str, resume: bool) -> list[str]:
        return [executable, "exec", *(["resume", "--last"] if resume else []), task]


AGENTS = {
    "claude": ClaudeCode("claude", "claude", "@anthropic-ai/claude-code"),
    "codex": Codex("codex", "codex", "@openai/codex"),
}
