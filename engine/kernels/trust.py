"""Which native library on disk the server may load: only one it built for itself.

Loading a shared library runs its code in the server (its constructors run inside ``dlopen``,
before anything it exports is looked at), and the library's name in the cache directory is
computable by anyone (``engine.kernels.build``). So a file found there is loaded only when:

- its directory (``{cache_dir}/kernels``, created 0700) is a directory, not a link, owned by this
  user and writable by nobody else (neither group nor others);
- the file is a regular file, not a link, owned by this user and writable by nobody else;
- its SHA-256 equals the digest the build that made it recorded beside it (``{name}.sha256``,
  checked the same way): a file this server did not build has none, or another.

The checks and the load go through one open descriptor (the directory opened without following
links, the file opened relative to it, the library loaded through ``/proc/self/fd``): a file
swapped in after the check is never the one loaded.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import stat
from pathlib import Path

DIGEST_SUFFIX = ".sha256"
"""The suffix of the file beside a library holding the digest its build recorded."""
_LOADS = itertools.count()  # the libraries this process has loaded
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NOTE: a FIFO in a file's place never blocks


class Untrusted(Exception):
    """A file or directory the server must not load code from; the message says why."""


def private_dir(path: Path) -> int:
    """An open descriptor of the directory ``path``, made 0700 when missing (its parents as
    ``mkdir -p`` makes them).

    Raises:
        Untrusted: ``path`` is a link or not a directory, another user's, or writable by group or
            others.
        OSError: it cannot be made or opened.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Untrusted(f"{path} is not a directory (a symbolic link?)") from exc
        raise
    try:
        _check_owner(os.fstat(fd), str(path))
    except Untrusted:
        os.close(fd)
        raise
    return fd


def open_trusted(dir_fd: int, name: str) -> int | None:
    """An open descriptor of the library ``name`` in the directory ``dir_fd`` (``private_dir``)
    when it passes every check of the module docstring; None when there is no such file.

    Raises:
        Untrusted: why it must not be loaded.
    """
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # NOTE: ELOOP is a symbolic link
        raise Untrusted(f"it cannot be opened as a plain file ({exc.strerror})") from exc
    try:
        _check_file(fd, name)
        if digest(fd) != _recorded(dir_fd, name):
            raise Untrusted("its bytes differ from the digest its build recorded")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_built(fd: int) -> None:
    """Check the library a build just wrote (``fd``) as a found one would be.

    Raises:
        Untrusted: it is not a regular file of this user's that only this user can write.
    """
    _check_file(fd, "the library just built")


def record(dir_fd: int, name: str, sha256: str, scratch: Path) -> None:
    """Record ``sha256`` as the digest of the library ``name`` in ``dir_fd`` (written under
    ``scratch``, a private directory on the same filesystem, then renamed into place).

    Raises:
        OSError: it cannot be written.
    """
    made = scratch / f"{name}{DIGEST_SUFFIX}"
    with open(made, "x", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(sha256 + "\n")
    os.replace(made, f"{name}{DIGEST_SUFFIX}", dst_dir_fd=dir_fd)


def digest(fd: int) -> str:
    """Hex SHA-256 of the whole file open at ``fd`` (read from its start)."""
    sha = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        sha.update(chunk)
    return sha.hexdigest()


def fd_path(fd: int) -> str:
    """A path that opens exactly the file open at ``fd`` (what ``dlopen`` is given), spelled as
    no earlier call of this process spelled it.

    NOTE: ``dlopen`` answers a name it has loaded before with that library, without opening the
    file: descriptor numbers are reused, so ``/proc/self/fd/5`` could stand for another library
    already loaded. ``./`` segments make each name new; the file is the same.
    """
    base = "/proc/self/fd/" if os.path.isdir("/proc/self/fd") else "/dev/fd/"
    return f"{base}{'./' * next(_LOADS)}{fd}"


def _recorded(dir_fd: int, name: str) -> str:
    """The digest recorded beside ``name``.

    Raises:
        Untrusted: none is recorded, or its file fails the checks a library's does.
    """
    try:
        fd = os.open(f"{name}{DIGEST_SUFFIX}", _OPEN, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise Untrusted("no build of this server recorded its digest") from exc
    except OSError as exc:
        raise Untrusted(f"its recorded digest cannot be opened ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as f:
        _check_file(fd, f"{name}{DIGEST_SUFFIX}")
        return f.read(256).decode("ascii", "replace").strip()


def _check_file(fd: int, what: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"{what} is not a regular file")
    _check_owner(st, what)


def _check_owner(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.getuid():
        raise Untrusted(f"{what} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Untrusted(f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
