"""The keeper of an embedded index: ``python -m store.index.embedded.keeper ROOT BINARY``.

Started detached (a session of its own) by the first process that needs the server
(``store.index.embedded.lease``); it runs ``BINARY`` (valkey-server) as its child, on Linux told to
die with the keeper, so no server outlives it:

- the server dies: started again (its append-only file gives the index back);
- the server cannot start on its data (a damaged append-only file): the file is moved aside
  (``appendonlydir.damaged-<time>``) and the server starts empty; still not: it starts without
  persistence (a full disk), each logged;
- no process has held ``users.lock`` for ``IDLE_S`` seconds: the server is stopped (its data
  flushed) and the keeper exits.

One keeper per directory: a second exits at once. It logs to ``keeper.log``.
"""

from __future__ import annotations

import fcntl
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from store.index.embedded.files import IndexFiles, die_with_parent, ping, server_args

log = logging.getLogger("kvproxy.index")

IDLE_S = 3.0
"""Seconds without a user before the server is stopped (a restarting kvproxy finds it still up)."""
POLL_S = 0.5
"""Seconds between the keeper's looks at its server and its users."""
START_S = 30.0
"""Seconds a server may take to answer after it starts (it loads its append-only file first)."""


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Keeper:
    """One server process and the rules that start and stop it (module docstring)."""

    def __init__(self, files: IndexFiles, binary: Path) -> None:
        self.files, self.binary = files, binary
        self.server: subprocess.Popen[bytes] | None = None
        self.persist = True
        self.stopping = False

    def start(self) -> None:
        """Start the server and wait until it answers; on failure try the fallbacks (module
        docstring) in turn.

        Raises:
            RuntimeError: not even a server without persistence started.
        """
        for fallback in (None, self._move_damaged_aside, self._without_persistence):
            if fallback is not None and not fallback():
                continue
            if self._start_once():
                return
        raise RuntimeError(f"the index server does not start: {_tail(self.files.log)}")

    def _start_once(self) -> bool:
        self.files.socket.unlink(missing_ok=True)  # NOTE: a crashed server's; the keeper lock is ours
        self.server = subprocess.Popen(
            server_args(self.binary, self.files, self.persist),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                log.warning("the index server exited at start (%s)", _tail(self.files.log))
                return False
            if ping(self.files.socket):
                log.info("index server %d up on %s (%s)", self.server.pid, self.files.socket, self.mode)
                return True
            time.sleep(0.05)
        log.warning("the index server did not answer within %.0f s: stopping it", START_S)
        self.stop()
        return False

    @property
    def mode(self) -> str:
        return f"append-only file in {self.files.append_only}" if self.persist else "nothing on disk"

    def _move_damaged_aside(self) -> bool:
        if not self.files.append_only.exists():
            return False
        aside = self.files.root / f"appendonlydir.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
        self.files.append_only.rename(aside)
        log.warning("the index's append-only file could not be loaded: moved to %s, starting empty", aside)
        return True

    def _without_persistence(self) -> bool:
        self.persist = False
        log.warning(
            "the index server cannot keep its data in %s: starting it with nothing on disk",
            self.files.root,
        )
        return True

    def stop(self) -> None:
        """Stop the server (SIGTERM: it flushes its append-only file) and remove its socket."""
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        self.files.socket.unlink(missing_ok=True)

    def run(self, start_lock: IO[str], users_present: Callable[[], bool]) -> None:
        """Keep the server up while there are users; return once ``IDLE_S`` pass without any, with
        the server stopped (under ``start_lock``, so no process joins the server as it stops)."""
        idle_since: float | None = None
        while not self.stopping:
            if self.server is None or self.server.poll() is not None:
                if self.server is not None:
                    log.warning("the index server exited (%s): starting it again", self.server.returncode)
                self.start()
            if users_present():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= IDLE_S:
                fcntl.flock(start_lock, fcntl.LOCK_EX)
                if not users_present():
                    break
                fcntl.flock(start_lock, fcntl.LOCK_UN)
                idle_since = None
            time.sleep(POLL_S)
        log.info("no kvproxy uses the index: stopping its server")
        self.stop()


def _users_present(users: IO[str]) -> bool:
    """Whether any process holds ``users.lock`` (shared): then an exclusive lock is refused."""
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(users, fcntl.LOCK_UN)
    return False


def main(argv: list[str]) -> int:
    """Keep the server of the index in ``argv[0]`` with the binary ``argv[1]`` (module docstring)."""
    files, binary = IndexFiles(Path(argv[0])), Path(argv[1])
    log_format = "%(asctime)s %(process)d %(levelname)s %(message)s"
    logging.basicConfig(filename=files.keeper_log, level=logging.INFO, format=log_format)
    keeper_lock = open(files.lock("keeper"), "a")  # NOTE: held for the process's life
    try:
        fcntl.flock(keeper_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # NOTE: another keeper has it
    keeper = Keeper(files, binary)

    def on_signal(*_: object) -> None:
        keeper.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(files.lock("start"), "a") as start_lock, open(files.lock("users"), "a") as users:
        try:
            keeper.run(start_lock, lambda: _users_present(users))
        except Exception:
            log.exception("the keeper failed")
            keeper.stop()
            return 1
        finally:
            keeper_lock.close()  # NOTE: before the start lock goes: a joiner then starts a new keeper
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
