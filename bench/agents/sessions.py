"""Running the sessions of one agent: a fresh session, a new one of the same kind of task, and
the most recent one resumed (after an optional pause), each as a subprocess through the
recording proxy, with the egress sink as its HTTP(S) proxy."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.agents.clients import Agent
from bench.agents.egress import EgressSink
from bench.agents.recorder import Recorder
from bench.agents.workspace import SESSIONS, make_repo

# NOTE: settings a user's shell may hold that would point an agent elsewhere or change its
# behaviour: the agent sees only what ``Agent.prepare`` sets
_INHERITED_PREFIXES = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "KVPROXY_")
_PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")


@dataclass
class Session:
    """One run of an agent CLI: its label in the recorder, exit code (None: killed at the
    timeout), seconds, and the last lines it printed."""

    label: str
    kind: str
    returncode: int | None
    seconds: float
    output_tail: str


def run_agent(
    agent: Agent,
    executable: str,
    recorder: Recorder,
    sink: EgressSink | None,
    workdir: Path,
    model: str,
    pause_s: float,
    timeout_s: float,
    on_session: Callable[[Session], None] = lambda _: None,
    extra_env: dict[str, str] | None = None,
) -> list[Session]:
    """The three sessions of ``agent`` in a new repository under ``workdir``, in order;
    ``on_session`` is called as each ends; ``extra_env`` is set on top of the agent's settings
    (a diagnosis, never the default check)."""
    repo = make_repo(workdir / agent.name / "repo")
    home = workdir / agent.name / "home"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_INHERITED_PREFIXES)}
    env = {k: v for k, v in env.items() if k.upper() not in _PROXY_VARIABLES}
    env["HOME"] = str(home)
    if sink is not None:
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env[name] = sink.url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env |= agent.prepare(home / "agent", recorder.base_url, model) | (extra_env or {})
    sessions = []
    for kind, task, resume in SESSIONS:
        if resume and pause_s > 0:
            print(f"{agent.name}: pausing {pause_s:.0f} s before the resumed session", flush=True)
            time.sleep(pause_s)
        label = f"{agent.name}/{kind}"
        recorder.label = label
        if sink is not None:
            sink.label = label
        print(f"{label}: {' '.join(agent.command(agent.binary, task, resume)[:-1])} ...", flush=True)
        sessions.append(_run(label, kind, agent.command(executable, task, resume), repo, env, timeout_s))
        on_session(sessions[-1])
    return sessions


def _run(
    label: str, kind: str, command: list[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> Session:
    started = time.monotonic()
    # NOTE: a session of its own, so a timeout ends the agent's children too (its shell commands)
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        output, returncode = _stop(proc), None
    except BaseException:
        _stop(proc)
        raise
    tail = "\n".join(output.decode("utf-8", "replace").splitlines()[-15:])
    return Session(label, kind, returncode, time.monotonic() - started, tail)


def _stop(proc: subprocess.Popen[bytes]) -> bytes:
    """End the agent and everything it started (SIGTERM, then SIGKILL); what it printed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=10)[0]
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0]
