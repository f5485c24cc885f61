"""Build the native decode step (``decode.cpp``) once per machine and load it with ctypes.

The library is compiled for this CPU (``-march=native``) into ``{cache_dir}/kernels/``, named by
a digest of the source, the flags, the compiler and the CPU's feature flags, so a cache directory
moved to another machine builds again instead of loading code its CPU cannot run. It takes about
two seconds with g++; without a compiler the engine keeps its torch decode step and says why.
Only a library this server built is loaded (``engine.kernels.trust``): the directory is private,
and a file at the library's name that this server did not build is built over, never loaded.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import xxhash

from engine.kernels import trust

SOURCES = ("decode.cpp", "team.h")
"""The kernel's files (package data): the step, and the team that shares its work (included)."""
log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-pthread", "-shared", "-fPIC", "-std=c++20"]


class KernelUnavailable(Exception):
    """The native step cannot be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else g++, c++ or clang++ on the PATH."""
    return os.environ.get("CXX") or next(
        (found for name in ("g++", "c++", "clang++") if (found := shutil.which(name))), None
    )


def load(cache_dir: Path, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The decode library for this machine, built on first use into ``{cache_dir}/kernels``, and
    loaded only when this server built it (``engine.kernels.trust``): any other file at its name
    is built over, never loaded. ``extra_flags`` follow ``FLAGS`` (``-mno-avx512f``: the AVX2
    path, which the tests build on an AVX-512 machine too).

    Raises:
        KernelUnavailable: no compiler, an unreadable source, a directory that is not private, or
            the build or the load failed; never another error (the engine then decodes with torch).
    """
    flags = [*FLAGS, *extra_flags]
    cxx, sources, name = _inputs(flags)
    directory = Path(cache_dir) / "kernels"
    try:
        dir_fd = trust.private_dir(directory)
    except trust.Untrusted as exc:
        raise KernelUnavailable(
            f"{exc}: no native code is loaded from it (make it this user's with mode 0700, or remove it)"
        ) from exc
    except OSError as exc:  # NOTE: a read-only cache directory, a file in the directory's place
        raise KernelUnavailable(f"cannot make {directory} ({exc})") from exc
    try:
        return _load(cxx, flags, sources, directory, dir_fd, name)
    except KernelUnavailable:
        raise
    except Exception as exc:  # NOTE: a library that cannot be loaded is the torch step, not a crash
        raise KernelUnavailable(f"cannot load {directory / name} ({type(exc).__name__}: {exc})") from exc
    finally:
        os.close(dir_fd)


def _inputs(flags: list[str]) -> tuple[str, dict[str, bytes], str]:
    """The compiler, the sources (file name -> bytes) and the library's file name: a digest of the
    sources, the flags, the compiler's version and the CPU's feature flags."""
    cxx = compiler()
    if cxx is None:
        raise KernelUnavailable("no C++ compiler on the PATH (install g++, or set CXX)")
    sources = {}
    for name in SOURCES:
        try:
            sources[name] = resources.files("engine.kernels").joinpath(name).read_bytes()
        except OSError as exc:
            # NOTE: the sources ship as package data (pyproject.toml); an install without them (a
            # damaged or hand-trimmed site-packages) decodes with torch rather than not starting
            raise KernelUnavailable(f"cannot read its source {name} ({exc}): reinstall kvproxy") from exc
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(f"{cxx} does not run: {exc}") from exc
    digest = xxhash.xxh3_64_hexdigest(
        b"".join(sources.values()) + " ".join([*flags, version, _cpu_flags()]).encode()
    )
    return cxx, sources, f"decode-{digest}.so"


def _load(
    cxx: str, flags: list[str], sources: dict[str, bytes], directory: Path, dir_fd: int, name: str
) -> ctypes.CDLL:
    """The library ``name`` in ``directory`` (open at ``dir_fd``): the one found there when this
    server built it and it loads, else one built now."""
    try:
        found = trust.open_trusted(dir_fd, name)
    except trust.Untrusted as exc:
        log.warning("native decode library %s not loaded: %s; building it again", directory / name, exc)
        found = None
    if found is not None:
        try:
            return _opened(found)
        except KernelUnavailable:
            pass  # NOTE: built here, yet it no longer loads (a system library changed): built again, once
        finally:
            os.close(found)
    built = _build(cxx, flags, sources, directory, dir_fd, name)
    try:
        return _opened(built)
    finally:
        os.close(built)


def _opened(fd: int) -> ctypes.CDLL:
    """The library open at ``fd``, loaded, its entry points typed.

    Raises:
        KernelUnavailable: it does not load, or lacks the decode step's entry points.
    """
    try:
        lib = ctypes.CDLL(trust.fd_path(fd))
        lib.kvp_scratch_floats.restype = ctypes.c_int64
        lib.kvp_decode.restype = None
    except (OSError, AttributeError) as exc:
        raise KernelUnavailable(f"the library does not load ({exc})") from exc
    return lib


def _build(
    cxx: str, flags: list[str], sources: dict[str, bytes], directory: Path, dir_fd: int, name: str
) -> int:
    """Compile ``sources`` with ``flags`` (file name -> bytes; the first is compiled) in a private temporary
    directory, record the digest of what was built, and rename it to ``name`` in ``dir_fd``
    (atomically: another process never loads a partial library).

    Returns:
        An open descriptor of the library built (the caller closes it).

    Raises:
        KernelUnavailable: the compiler failed, or the directory cannot be written.
    """
    try:
        # NOTE: mkdtemp makes the directory 0700: nobody else can change what is compiled or built
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            for source, text in sources.items():
                (Path(tmp) / source).write_bytes(text)
            # NOTE: relative names, so the library holds no temporary path and builds alike
            done = subprocess.run(
                [cxx, *flags, SOURCES[0], "-o", "decode.so"], capture_output=True, text=True, cwd=tmp
            )
            if done.returncode != 0:
                raise KernelUnavailable(
                    f"{cxx} could not build the decode step (exit status {done.returncode}): "
                    f"{done.stderr.strip()[-2000:] or 'it printed nothing'}"
                )
            out = Path(tmp) / "decode.so"
            os.chmod(out, 0o700)
            fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                trust.check_built(fd)
                os.replace(out, name, dst_dir_fd=dir_fd)
                trust.record(dir_fd, name, trust.digest(fd), Path(tmp))
            except BaseException:
                os.close(fd)
                raise
            return fd
    except trust.Untrusted as exc:
        raise KernelUnavailable(f"cannot build it in {directory} ({exc})") from exc
    except OSError as exc:  # NOTE: a read-only or full cache directory, a compiler that vanished
        raise KernelUnavailable(f"cannot build it in {directory} ({exc})") from exc
