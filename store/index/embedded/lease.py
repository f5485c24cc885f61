"""A process's use of the embedded index (``join``): the server started if none runs, held while
the process lives, started again if it goes away."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import redis

from store.index.embedded.files import (
    EmbeddedIndexError,
    IndexFiles,
    alive,
    held,
    last_lines,
    read_from,
    ready,
    valkey_binary,
)

log = logging.getLogger(__name__)

START_S = 60.0
"""Seconds a joining process waits for the server to answer (then it serves misses until it does)."""
WATCH_S = 2.0
"""Seconds between a process's checks that its server still answers."""

_leases: dict[Path, EmbeddedIndex] = {}
_leases_lock = threading.Lock()


class EmbeddedIndex:
    """This process's lease on the embedded index in ``files.root``: a shared lock on
    ``users.lock``, held until the process exits (the kernel drops it then, SIGKILL included), and a
    daemon thread that starts the server's keeper again when it is gone (meanwhile the cache's
    Redis calls fail fast, and requests are served as misses)."""

    def __init__(self, files: IndexFiles) -> None:
        self.files = files
        self._users: IO[str] | None = None

    @property
    def url(self) -> str:
        """The ``--redis-url`` of the server: ``unix://<socket>``."""
        return self.files.url

    def hold(self) -> None:
        """Take the lease (again, when its lock file was deleted: a removed cache directory): a
        shared lock on ``users.lock``, the directory made if missing.

        Raises:
            OSError: the directory cannot be written.
        """
        path = self.files.lock("users")
        if self._users is not None and _same_file(self._users, path):
            return
        self.files.root.mkdir(parents=True, exist_ok=True)
        users = open(path, "a")  # NOTE: held for the process's life
        fcntl.flock(users, fcntl.LOCK_SH)
        if self._users is not None:
            self._users.close()
        self._users = users

    def ensure(self) -> subprocess.Popen[bytes] | None:
        """Start the server's keeper unless the server answers or a keeper lives, one process at a
        time (``start.lock``, also held by a keeper while it stops its server); the keeper started,
        else None.

        Raises:
            OSError: the directory cannot be written.
            NoServerBinary: a keeper is needed, and no server binary runs here (a server that
                answers is joined without one).
        """
        self.hold()
        with self._start_lock():
            if alive(self.files.socket) or held(self.files.lock("keeper")):
                return None
            keeper = self._spawn_keeper()
            # NOTE: the lock is kept until the keeper holds its own (or has exited): no second start
            while keeper.poll() is None and not held(self.files.lock("keeper")):
                time.sleep(0.02)
            return keeper

    def wait(self, keeper: subprocess.Popen[bytes] | None) -> None:
        """Wait until the server is ready (``files.ready``), at most ``START_S`` seconds.

        Raises:
            EmbeddedIndexError: no answer in time, or the keeper (``keeper``, or the one that was
                alive) exited first; the message has the end of its log.
        """
        deadline = time.monotonic() + START_S
        while not ready(self.files.socket):
            exited = keeper.poll() is not None if keeper is not None else not held(self.files.lock("keeper"))
            if exited or time.monotonic() > deadline:
                why = "its keeper exited" if exited else f"no answer within {START_S:.0f} s"
                raise EmbeddedIndexError(
                    f"the embedded index on {self.files.socket} did not start ({why}): "
                    f"{last_lines(self.files.keeper_log, 1)}"
                )
            time.sleep(0.05)

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        with open(self.files.lock("start"), "a") as start_lock:
            fcntl.flock(start_lock, fcntl.LOCK_EX)
            yield

    def _spawn_keeper(self) -> subprocess.Popen[bytes]:
        """The keeper, started in a session of its own (a Ctrl-C in its starter's terminal is not
        its), in the index's directory with ``-P`` (so no ``store`` module of the starter's working
        directory shadows kvproxy's), its errors appended to ``keeper.log``."""
        command = [
            sys.executable,
            "-P",
            "-m",
            "store.index.embedded.keeper",
            str(self.files.root),
            str(valkey_binary()),
        ]
        try:
            errors: IO[bytes] | int = open(self.files.keeper_log, "ab")
        except OSError:
            errors = subprocess.DEVNULL
        try:
            return subprocess.Popen(
                command,
                cwd=self.files.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
            )
        finally:
            if not isinstance(errors, int):
                errors.close()

    def report(self, since: int) -> None:
        """Log what the keeper warned about from byte ``since`` of its log (a damaged file moved
        aside), damaged files still set aside, and a server keeping nothing on disk (whose
        directory cannot take even the keeper's log)."""
        for line in read_from(self.files.keeper_log, since).splitlines():
            if " WARNING " in line:
                log.warning("embedded index: %s", line.partition(" WARNING ")[2])
        aside = sorted(self.files.root.glob("appendonlydir.damaged-*"))
        if aside:
            log.warning(
                "embedded index: %d damaged append-only file(s) set aside in %s (%s): delete them "
                "once looked at",
                len(aside),
                self.files.root,
                ", ".join(p.name for p in aside),
            )
        try:
            persisted = redis.Redis(unix_socket_path=str(self.files.socket)).config_get("appendonly")
        except redis.RedisError:
            return
        if persisted.get("appendonly") == "no":
            log.warning(
                "embedded index: keeps nothing on disk, %s cannot be written (a full disk?); it is "
                "forgotten when its server stops",
                self.files.root,
            )

    def watch(self, answered: bool) -> None:
        """Check every ``WATCH_S`` seconds, in a daemon thread, that the server answers (any
        reply: one refusing writes on a full disk answers too); start its keeper again when it is
        gone (the keeper itself restarts a server that dies or hangs). Logged once per outage;
        ``answered``: whether it answered at start."""

        def loop() -> None:
            down = not answered
            while True:
                time.sleep(WATCH_S)
                if alive(self.files.socket):
                    if down:
                        log.info("the embedded index answers on %s", self.files.socket)
                    down = False
                    continue
                if not down:
                    log.warning("the embedded index went away: starting it again")
                down = True
                try:
                    self.ensure()
                except (OSError, EmbeddedIndexError) as exc:
                    log.warning("the embedded index cannot be started again: %s", exc)

        threading.Thread(target=loop, name="embedded-index-watch", daemon=True).start()


def _same_file(opened: IO[str], path: Path) -> bool:
    try:
        return os.fstat(opened.fileno()).st_ino == path.stat().st_ino
    except OSError:
        return False


def joined(url: str | None) -> IndexFiles | None:
    """The files of the embedded index this process joined whose ``url`` this is, else None."""
    return next((index.files for index in list(_leases.values()) if index.url == url), None)


def join(root: Path) -> EmbeddedIndex:
    """This process's lease on the embedded index in ``root`` (one per directory and process):
    the server started or joined, logged once, and watched. A server that does not answer is
    logged, and started again by the watch (meanwhile: misses).

    Raises:
        EmbeddedIndexError: ``root`` cannot be written (``NoServerBinary``: no server answers and
            no server binary runs here).
    """
    root = root.expanduser().resolve()
    with _leases_lock:
        if root in _leases:
            return _leases[root]
        index = EmbeddedIndex(IndexFiles(root))
        try:
            since = index.files.keeper_log.stat().st_size if index.files.keeper_log.exists() else 0
            keeper = index.ensure()
        except OSError as exc:
            raise EmbeddedIndexError(
                f"cannot write the embedded index's directory {root} ({exc}): give a writable "
                "--cache-dir (KVPROXY_CACHE_DIR), or --redis-url for a Redis of your own"
            ) from exc
        try:
            index.wait(keeper)
        except EmbeddedIndexError as exc:
            log.warning("%s; requests are served uncached until it answers", exc)
            answered = False
        else:
            log.info(
                "index: embedded Valkey (%s) on %s, data in %s (--redis-url for a Redis of your own)",
                "started" if keeper is not None else "joined",
                index.files.socket,
                root,
            )
            index.report(since)
            answered = True
        index.watch(answered)
        _leases[root] = index
        return index
