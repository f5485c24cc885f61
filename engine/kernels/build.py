"""Build the native decode step (``decode.cpp``) once per machine and load it with ctypes.

The library is compiled for this CPU (``-march=native``) into ``{cache_dir}/kernels/``, named by
a digest of the source, the flags, the compiler and the CPU's feature flags, so a cache directory
moved to another machine builds again instead of loading code its CPU cannot run. It takes about
two seconds with g++; without a compiler the engine keeps its torch decode step and says why.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import xxhash

SOURCES = ("decode.cpp", "team.h")
"""The kernel's files (package data): the step, and the team that shares its work (included)."""
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


def load(cache_dir: Path) -> ctypes.CDLL:
    """The decode library for this machine, built on first use.

    Raises:
        KernelUnavailable: no compiler, an unreadable source, or the build or the load failed.
    """
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
        b"".join(sources.values()) + " ".join([*FLAGS, version, _cpu_flags()]).encode()
    )
    path = Path(cache_dir) / "kernels" / f"decode-{digest}.so"
    if not path.exists():
        _build(cxx, sources, path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        # NOTE: the build writes atomically, so a library that does not load was damaged from
        # outside (a full disk, a copied cache directory): built again, once
        _build(cxx, sources, path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise KernelUnavailable(f"cannot load {path}: {exc}") from exc
    lib.kvp_scratch_floats.restype = ctypes.c_int64
    lib.kvp_decode.restype = None
    return lib


def _build(cxx: str, sources: dict[str, bytes], path: Path) -> None:
    """Compile ``sources`` (file name -> text; the first is compiled) into ``path``, replacing it
    atomically (another process never loads a partial library).

    Raises:
        KernelUnavailable: the compiler failed.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            for name, text in sources.items():
                (Path(tmp) / name).write_bytes(text)
            src, out = Path(tmp) / SOURCES[0], Path(tmp) / "decode.so"
            done = subprocess.run([cxx, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
            if done.returncode != 0:
                raise KernelUnavailable(
                    f"{cxx} could not build the decode step (exit status {done.returncode}): "
                    f"{done.stderr.strip()[-2000:] or 'it printed nothing'}"
                )
            out.replace(path)
    except OSError as exc:  # NOTE: a read-only or full cache directory, a compiler that vanished
        raise KernelUnavailable(f"cannot build it in {path.parent} ({exc})") from exc
