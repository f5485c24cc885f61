"""``python -m bench.agents``: Claude Code and Codex CLI, installed from npm, run against a kvproxy
server with only its base URL, a key and the model name set; prints a per-request table of
prompt and cached tokens and checks issue 46's acceptance. Exits 0 with a message (skipped) when
npm or the agents are absent; 1 when a check fails. See docs/agents.md."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
import httpx

from bench.agents import report
from bench.agents.clients import AGENTS
from bench.agents.egress import EgressSink
from bench.agents.recorder import Recorder
from bench.agents.sessions import Session, run_agent

GEMMA = "gemma3-270m"


def _serve(
    kvproxy: str, workdir: Path, model: str, extra: tuple[str, ...], wait_s: float
) -> tuple[subprocess.Popen[bytes], str]:
    """``KVPROXY serve`` on a free port with a block store and index of its own, once it answers
    ``/health``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [*shlex.split(kvproxy), "serve", "--model", model, "--port", str(port)]
    command += ["--redis-url", "memory://", "--blob-dir", str(workdir / "blobs"), *extra]
    log = (workdir / "serve.log").open("wb")
    # NOTE: run from the workdir: `python -m` puts its working directory first on sys.path
    proc = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(
                f"kvproxy serve exited with {proc.returncode}; see {workdir / 'serve.log'}"
            )
        try:
            httpx.get(f"{url}/health", timeout=2).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            time.sleep(1)
    proc.kill()
    raise click.ClickException(f"kvproxy serve did not answer in {wait_s:.0f} s; see {workdir / 'serve.log'}")


@click.command()
@click.option("--base-url", help="A running server's root URL (no /v1); default: start kvproxy serve here.")
@click.option("--model", default=GEMMA, show_default=True, help="The model name the agents ask for.")
@click.option(
    "--agents", "names", default="claude,codex", show_default=True, help="Comma-separated: claude, codex."
)
@click.option(
    "--npm-prefix",
    type=click.Path(path_type=Path),
    multiple=True,
    help="Where `npm i --prefix DIR @openai/codex @anthropic-ai/claude-code` put the agents (else PATH).",
)
@click.option(
    "--pause-s",
    default=5.0,
    show_default=True,
    help="Seconds between the new and the resumed session (900: the 15-minute check).",
)
@click.option(
    "--session-timeout-s", default=1200.0, show_default=True, help="Longest one agent session may run."
)
@click.option(
    "--min-tool-calls",
    default=2,
    show_default=True,
    help="Tool calls the fresh and resumed sessions must make.",
)
@click.option(
    "--kvproxy",
    default=f"{sys.executable} -m proxy.cli",
    show_default="python -m proxy.cli",
    help="The command that runs kvproxy, for the server this starts.",
)
@click.option("--serve-arg", multiple=True, help="Extra argument for the kvproxy serve this starts (repeat).")
@click.option("--serve-wait-s", default=900.0, show_default=True, help="Longest wait for the started server.")
@click.option(
    "--agent-env",
    multiple=True,
    help="NAME=VALUE set for the agents besides their settings (repeat): to diagnose, not for the check.",
)
@click.option(
    "--no-egress-sink", is_flag=True, help="Let the agents reach the network (default: refuse and list it)."
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    help="Keep repositories, homes and logs here (default: a temporary folder).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(path_type=Path),
    help="Write the table, checks and sessions as JSON.",
)
def main(
    base_url: str | None,
    model: str,
    names: str,
    npm_prefix: tuple[Path, ...],
    pause_s: float,
    session_timeout_s: float,
    min_tool_calls: int,
    kvproxy: str,
    serve_arg: tuple[str, ...],
    serve_wait_s: float,
    agent_env: tuple[str, ...],
    no_egress_sink: bool,
    workdir: Path | None,
    json_out: Path | None,
) -> None:
    """Run each agent's sessions through a recording proxy and report reuse per request."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in AGENTS]
    if unknown:
        raise click.BadParameter(
            f"unknown agent(s) {unknown}; known: {sorted(AGENTS)}", param_hint="--agents"
        )
    extra_env = dict(item.split("=", 1) for item in agent_env if "=" in item)
    search = [p / "node_modules" / ".bin" for p in npm_prefix]
    found = {n: AGENTS[n].find(search) for n in wanted}
    if shutil.which("npm") is None or not all(found.values()):
        missing = [AGENTS[n].package for n, exe in found.items() if exe is None]
        click.echo(
            f"skipped: npm or the agents are absent ({', '.join(missing) or 'npm'}); install with "
            f"`npm i --prefix DIR {' '.join(AGENTS[n].package for n in wanted)}` and pass --npm-prefix DIR"
        )
        return
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kvproxy-agents-"))
    workdir.mkdir(parents=True, exist_ok=True)
    click.echo(f"workdir: {workdir}")
    server = None
    if base_url is None:
        click.echo(f"starting kvproxy serve --model {model} ...")
        server, base_url = _serve(kvproxy, workdir, model, serve_arg, serve_wait_s)
    # NOTE: a SIGTERM ends the run as Ctrl-C does, so the server this started is stopped too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    recorder = Recorder(base_url, log=workdir / "requests.jsonl").start()
    sink = None if no_egress_sink else EgressSink().start()
    sessions: list[Session] = []
    try:
        for name in wanted:
            exe = found[name]
            assert exe is not None
            sessions += run_agent(
                AGENTS[name],
                exe,
                recorder,
                sink,
                workdir,
                model,
                pause_s,
                session_timeout_s,
                _progress(recorder),
                extra_env,
            )
    finally:
        recorder.stop()
        if sink is not None:
            sink.stop()
        if server is not None:
            server.terminate()
            server.wait(60)
    _print(recorder, sessions, sink, workdir, min_tool_calls, json_out)


def _progress(recorder: Recorder) -> Callable[[Session], None]:
    """Prints each session's rows as it ends (a run takes minutes)."""

    def show(session: Session) -> None:
        ended = "timed out" if session.returncode is None else f"exit {session.returncode}"
        click.echo(f"{session.label}: {ended} after {session.seconds:.0f} s")
        click.echo(report.markdown(report.rows(recorder, [session])), nl=True)

    return show


def _print(
    recorder: Recorder,
    sessions: list[Session],
    sink: EgressSink | None,
    workdir: Path,
    min_tool_calls: int,
    json_out: Path | None,
) -> None:
    table = report.rows(recorder, sessions)
    checks = report.checks(recorder, sessions, min_tool_calls)
    click.echo("\n" + report.markdown(table) + "\n")
    click.echo(report.summary(table) + "\n")
    for row in table:
        if row["error"]:
            click.echo(f"refused: {row['session']} step {row['step']}: {row['status']} {row['error']}")
    for path in report.save_refused(recorder, workdir / "refused"):
        click.echo(f"refused body: {path}")
    for session in sessions:
        ended = "timed out" if session.returncode is None else f"exit {session.returncode}"
        click.echo(f"{session.label}: {ended} after {session.seconds:.0f} s")
    if sink is not None:
        for label, attempt in sink.attempts:
            click.echo(f"egress refused: {label}: {attempt}")
    for check in checks:
        click.echo(f"{'PASS' if check.passed else 'FAIL'} {check.name}: {check.detail}")
    if json_out is not None:
        json_out.write_text(
            json.dumps(
                {
                    "rows": table,
                    "checks": [vars(c) for c in checks],
                    "sessions": [vars(s) for s in sessions],
                    "egress": [list(a) for a in sink.attempts] if sink else [],
                },
                indent=1,
            )
        )
    if not all(c.passed for c in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
