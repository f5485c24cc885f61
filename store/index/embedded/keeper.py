"""The keeper of an embedded index: ``python -m store.index.embedded.keeper ROOT BINARY``.

Started detached (a session of its own) by the first process that needs the server
(``store.index.embedded.lease``); it runs ``BINARY`` (valkey-server) as its child, on Linux told to
die with the keeper, so no server outlives it:

- the server dies, or answers nothing for ``HUNG_S`` seconds (stopped, its socket removed):
  started again (its append-only file gives the index back);
- the server cannot start on its data (a damaged append-only file): the file is moved aside
  (``appendonlydir.damaged-<time>``) and the server starts empty; still not: it starts without
  persistence (a full disk), each logged;
- no process has held ``users.lock`` for ``IDLE_S`` seconds, or the directory was removed: the
  server is stopped (its data flushed) and the keeper exits.

One keeper per directory: a second exits at once. It logs to ``keeper.log``.
"""

from __future__ import annotations

import fcntl
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from store.index.embedded.files import (
    IndexFiles,
    alive,
    die_with_parent,
    held,
    last_lines,
    read_from,
    ready,
    server_args,
)

log = logging.getLogger("kvproxy.index")

IDLE_S = 3.0
"""Seconds without a user before the server is stopped (a restarting kvproxy finds it still up)."""
POLL_S = 0.5
"""Seconds between the keeper's looks at its server and its users."""
SLOW_S = 30.0
"""Seconds after which a server that has not answered since it started is said to be slow (it
loads its append-only file first; it is waited for all the same)."""
HUNG_S = 15.0
"""Seconds a running server may answer nothing (not even ``-LOADING``) before it is restarted."""
LOAD_FAILED = re.compile(
    r"(?m)^\S+ .* # .*(reading the append only file|reading the RDB base file|manifest)", re.IGNORECASE
)
"""A warning of the server's log that it could not read its append-only file or its manifest
(Valkey's ``aof.c``: ``Bad file format reading the append only file ...``, ``Unexpected end of file
reading ...``, ``Invalid AOF manifest file format``); never its own writes failing (``Write error
writing append only file on disk``: a full disk) or its notices (``Creating AOF base file``)."""


class Keeper:
    """One server process and the rules that start and stop it (module docstring)."""

    def __init__(self, files: IndexFiles, binary: Path) -> None:
        self.files, self.binary = files, binary
        self.server: subprocess.Popen[bytes] | None = None
        self.logged = 0
        """The size of the server's log before its last start (what it said since is its own)."""
        self.persist = True
        self.stopping = False
        self.root_id = _inode(files.root)
        self.loaded = False
        """Whether the running server has loaded its data (and a cut in it was reported)."""
        self.socket_id: int | None = None
        """The inode of the socket file the server made (a newer server's at the same path is not
        its to remove)."""

    def start(self) -> None:
        """Start the server and wait until it answers (a server loading a large file answers
        ``-LOADING``: it is waited for, however long); when it exits instead, try the fallbacks
        (module docstring) in turn.

        Raises:
            RuntimeError: not even a server without persistence started.
        """
        for fallback in (None, self._move_damaged_aside, self._without_persistence):
            if fallback is not None and not fallback():
                continue
            if self._start_once():
                return
        raise RuntimeError(f"the index server does not start: {last_lines(self.files.log, 5)}")

    def _start_once(self) -> bool:
        self.files.socket.unlink(missing_ok=True)  # NOTE: a crashed server's; the keeper lock is ours
        self.logged = _size(self.files.log)
        self.server = subprocess.Popen(
            server_args(self.binary, self.files, self.persist),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        started, slow = time.monotonic(), False
        while not alive(self.files.socket):
            if self.server.poll() is not None:
                log.info(
                    "the index server exited at start (%s): %s",
                    self.server.returncode,
                    last_lines(self.files.log, 5),
                )
                return False
            if not slow and time.monotonic() - started > SLOW_S:
                slow = True
                log.info("the index server has not answered for %.0f s: still waiting", SLOW_S)
            time.sleep(0.05)
        self.socket_id, self.loaded = _inode(self.files.socket), False
        log.info("index server %d up on %s (%s)", self.server.pid, self.files.socket, self.mode)
        return True

    @property
    def mode(self) -> str:
        return f"append-only file in {self.files.append_only}" if self.persist else "nothing on disk"

    def _move_damaged_aside(self) -> bool:
        """Move the append-only file aside when the server's log of its failed start says it could
        not read it (``LOAD_FAILED``); False when it does not (a server that failed for another
        reason: a full disk) or there is no file."""
        folder = self.files.append_only
        if not folder.is_dir() or not LOAD_FAILED.search(read_from(self.files.log, self.logged)):
            return False
        aside = self.files.root / f"appendonlydir.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
        folder.rename(aside)
        log.warning("the index's append-only file could not be loaded: moved to %s, starting empty", aside)
        return True

    def _report_cut(self) -> None:
        """Log an append-only file the server loaded only up to a cut (a crash mid-write): its log
        says so once it has loaded (``Truncating the AOF <file> at offset <n>``)."""
        said = read_from(self.files.log, self.logged)
        if cut := re.findall(r"Truncating the AOF (\S+) at offset (\d+)", said):
            log.warning(
                "the index's append-only file was cut short (a crash or a full disk): loaded up to "
                "byte %s of %s; what came after is gone (those prompts are misses until stored again)",
                *cut[-1][::-1],
            )

    def _without_persistence(self) -> bool:
        self.persist = False
        log.warning(
            "the index server cannot keep its data in %s: starting it with nothing on disk", self.files.root
        )
        return True

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the server (SIGTERM: it flushes its append-only file and removes its socket;
        SIGKILL after ``grace_s`` seconds, or at once when its socket file is gone or another's:
        then it must not remove that one)."""
        ours = self.socket_id is not None and _inode(self.files.socket) == self.socket_id
        if self.server is not None and self.server.poll() is None:
            if ours:
                self.server.terminate()
            try:
                self.server.wait(grace_s if ours else 0)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        if ours:
            self.files.socket.unlink(missing_ok=True)
        self.socket_id = None

    def run(self, start_lock: IO[str], users_present: Callable[[], bool]) -> None:
        """Keep the server up while there are users: started again when it exits, or when it has
        answered nothing for ``HUNG_S`` seconds (stopped, or its socket removed); return once
        ``IDLE_S`` pass without users, with the server stopped (under ``start_lock``, so no
        process joins the server as it stops)."""
        idle_since: float | None = None
        answered = time.monotonic()
        while not self.stopping:
            if _inode(self.files.root) != self.root_id:
                log.info("the index's directory was removed: stopping its server")
                break
            if self.server is None or self.server.poll() is not None:
                if self.server is not None:
                    log.warning("the index server exited (%s): starting it again", self.server.returncode)
                self.start()
                answered = time.monotonic()
            elif alive(self.files.socket):
                answered = time.monotonic()
                if not self.loaded and ready(self.files.socket):
                    self.loaded = True
                    self._report_cut()
            elif time.monotonic() - answered > HUNG_S:
                log.warning("the index server answered nothing for %.0f s: starting it again", HUNG_S)
                self.stop(grace_s=5.0)
                self.server = None
                continue
            if users_present():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= IDLE_S:
                fcntl.flock(start_lock, fcntl.LOCK_EX)
                if not users_present():
                    log.info("no kvproxy uses the index: stopping its server")
                    break
                fcntl.flock(start_lock, fcntl.LOCK_UN)
                idle_since = None
            time.sleep(POLL_S)
        else:
            log.info("told to stop: stopping the index server")
        self.stop()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _take(lock: IO[str], tries: int = 40) -> bool:
    """Take ``lock`` exclusively; False when it stays taken for ``tries`` x 50 ms (a process asking
    whether a keeper lives holds it for an instant, another keeper for good)."""
    for _ in range(tries):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.05)
    return False


def main(argv: list[str]) -> int:
    """Keep the server of the index in ``argv[0]`` with the binary ``argv[1]`` (module docstring)."""
    files, binary = IndexFiles(Path(argv[0])), Path(argv[1])
    log_format = "%(asctime)s %(process)d %(levelname)s %(message)s"
    logging.basicConfig(filename=files.keeper_log, level=logging.INFO, format=log_format)
    keeper_lock = open(files.lock("keeper"), "a")  # NOTE: held for the process's life
    if not _take(keeper_lock):
        return 0  # NOTE: another keeper has it
    keeper = Keeper(files, binary)

    def on_signal(*_: object) -> None:
        keeper.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(files.lock("start"), "a") as start_lock:
        try:
            keeper.run(start_lock, lambda: held(files.lock("users")))
        except Exception:
            log.exception("the keeper failed")
            keeper.stop()
            return 1
        finally:
            keeper_lock.close()  # NOTE: before the start lock goes: a joiner then starts a new keeper
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
