"""A process's use of the embedded index (``join``): the server started if none runs, held while
the process lives, started again if it goes away."""

from __future__ import annotations

import fcntl
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import redis

from store.index.embedded.files import EmbeddedIndexError, IndexFiles, ping, valkey_binary

log = logging.getLogger(__name__)

START_S = 60.0
"""Seconds a process waits for the server to answer after it (or another process) started it."""
WATCH_S = 2.0
"""Seconds between a process's checks that its server still answers."""

_leases: dict[Path, EmbeddedIndex] = {}
_leases_lock = threading.Lock()


class EmbeddedIndex:
    """This process's lease on the embedded index in ``files.root``: a shared lock on
    ``users.lock``, held until the process exits (the kernel drops it then, SIGKILL included), and a
    daemon thread that starts the server again when it stops answering (meanwhile the cache's
    Redis calls fail fast, and requests are served as misses)."""

    def __init__(self, files: IndexFiles, binary: Path) -> None:
        self.files, self.binary = files, binary
        self._users: IO[str] | None = None

    @property
    def url(self) -> str:
        """The ``--redis-url`` of the server: ``unix://<socket>``."""
        return self.files.url

    def hold(self) -> None:
        """Take the lease: a shared lock on ``users.lock``, which the directory gets if missing.

        Raises:
            EmbeddedIndexError: the directory cannot be written.
        """
        try:
            self.files.root.mkdir(parents=True, exist_ok=True)
            self._users = open(self.files.lock("users"), "a")  # NOTE: held for the process's life
            fcntl.flock(self._users, fcntl.LOCK_SH)
        except OSError as exc:
            raise EmbeddedIndexError(
                f"cannot write the embedded index's directory {self.files.root} ({exc}): give a "
                "writable --cache-dir (KVPROXY_CACHE_DIR), or --redis-url for a Redis of your own"
            ) from exc

    def ensure(self) -> bool:
        """Start the server unless it (or a keeper starting it) is there, one process at a time
        (``start.lock``); wait until it answers. True when this call started a keeper.

        Raises:
            EmbeddedIndexError: no answer within ``START_S`` seconds.
        """
        # NOTE: under the lock even when it answers: a keeper stopping its server holds it
        with open(self.files.lock("start"), "a") as start_lock:
            fcntl.flock(start_lock, fcntl.LOCK_EX)
            started = not ping(self.files.socket) and not self._keeper_alive()
            logged = self._log_size()
            if started:
                self._spawn_keeper()
            deadline = time.monotonic() + START_S
            while not ping(self.files.socket):
                if time.monotonic() > deadline:
                    raise EmbeddedIndexError(
                        f"the embedded index server did not answer on {self.files.socket} within "
                        f"{START_S:.0f} s; see {self.files.keeper_log} and {self.files.log}"
                    )
                time.sleep(0.05)
        if started:
            self._relay_warnings(logged)
        return started

    def _log_size(self) -> int:
        try:
            return self.files.keeper_log.stat().st_size
        except OSError:
            return 0

    def _relay_warnings(self, since: int) -> None:
        """Log the keeper's warnings from byte ``since`` of its log (a damaged file moved aside) as
        this process's, and a server keeping nothing on disk (its own log may not be written)."""
        try:
            with self.files.keeper_log.open("rb") as keeper_log:
                keeper_log.seek(since)
                lines = keeper_log.read().decode(errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            if " WARNING " in line:
                log.warning("embedded index: %s", line.partition(" WARNING ")[2])
        try:
            persisted = redis.Redis(unix_socket_path=str(self.files.socket)).config_get("appendonly")
        except redis.RedisError:
            return
        if persisted.get("appendonly") == "no":
            log.warning(
                "the embedded index keeps nothing on disk: %s cannot be written (a full disk?); it is "
                "forgotten when its server stops",
                self.files.root,
            )

    def _keeper_alive(self) -> bool:
        with open(self.files.lock("keeper"), "a") as keeper_lock:
            try:
                fcntl.flock(keeper_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    def _spawn_keeper(self) -> None:
        subprocess.Popen(
            [sys.executable, "-m", "store.index.embedded.keeper", str(self.files.root), str(self.binary)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # NOTE: a Ctrl-C in its starter's terminal is not its
        )

    def watch(self) -> None:
        """Check every ``WATCH_S`` seconds, in a daemon thread, that the server answers; start it
        again when not (logged once per outage)."""

        def loop() -> None:
            gone = False
            while True:
                time.sleep(WATCH_S)
                if ping(self.files.socket):
                    if gone:
                        log.info("the embedded index answers again on %s", self.files.socket)
                    gone = False
                    continue
                if not gone:
                    log.warning("the embedded index went away: starting it again (meanwhile: misses)")
                gone = True
                try:
                    self.ensure()
                except EmbeddedIndexError as exc:
                    log.warning("%s", exc)

        threading.Thread(target=loop, name="embedded-index-watch", daemon=True).start()


def joined(url: str | None) -> IndexFiles | None:
    """The files of the embedded index this process joined whose ``url`` this is, else None."""
    return next((index.files for index in list(_leases.values()) if index.url == url), None)


def join(root: Path) -> EmbeddedIndex:
    """This process's lease on the embedded index in ``root`` (one per directory and process):
    the server started or joined, logged once, and watched. A server that does not answer is
    logged, and started again by the watch (meanwhile: misses).

    Raises:
        EmbeddedIndexError: ``root`` cannot be written (``NoServerBinary``: no server binary for
            this platform).
    """
    root = root.absolute()
    with _leases_lock:
        if root in _leases:
            return _leases[root]
        index = EmbeddedIndex(IndexFiles(root), valkey_binary())
        index.hold()
        try:
            how = "started" if index.ensure() else "joined"
        except EmbeddedIndexError as exc:
            how = f"not answering yet: {exc}"
        log.info(
            "block index: embedded Valkey (%s) on %s, data in %s (--redis-url for a Redis of your own)",
            how,
            index.files.socket,
            index.files.append_only,
        )
        index.watch()
        _leases[root] = index
        return index
