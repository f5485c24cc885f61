"""Code planted where the native decode library goes is never loaded: a file at the library's name
that this server did not build, or that others can write, or that sits in a directory others can
write, never runs (a planted library's constructor would write a marker file the moment it was
loaded); the server builds its own over a planted file, refuses a directory others can write
(the torch decode step, with a warning, never an uncaught error), and makes its directory 0700.
The checks are ``engine.kernels.trust``'s."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.decoding import pick_decoder
from engine.kernels.build import KernelUnavailable, compiler, load
from engine.model.loading import load_model
from tests.helpers import build_tiny_model

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler")

PLANTED = """
#include <cstdio>
__attribute__((constructor)) static void planted() {
    if (FILE* f = std::fopen("%s", "w")) { std::fputs("the planted library ran", f); std::fclose(f); }
}
extern "C" long kvp_scratch_floats() { return 0; }
extern "C" void kvp_decode() {}
"""
"""A library that looks like the decode step's and runs code as it loads."""


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[bytes, Path]:
    """A planted library's bytes (compiled with the system's compiler) and the marker it writes."""
    where = tmp_path_factory.mktemp("planted")
    marker = where / "ran"
    (where / "planted.cpp").write_text(PLANTED % marker)
    cxx = compiler()
    assert cxx is not None
    subprocess.run([cxx, "-shared", "-fPIC", "planted.cpp", "-o", "planted.so"], cwd=where, check=True)
    return (where / "planted.so").read_bytes(), marker


@pytest.fixture(scope="module")
def name(tmp_path_factory) -> str:
    """The library's file name on this machine, as a build by another process gives it."""
    cache = tmp_path_factory.mktemp("built")
    build = f"from pathlib import Path; from engine.kernels.build import load; load(Path({str(cache)!r}))"
    subprocess.run([sys.executable, "-c", build], check=True)
    (built,) = (cache / "kernels").glob("decode-*.so")
    return built.name


def plant(directory: Path, name: str, data: bytes, *, mode: int = 0o700, recorded: str | None = None) -> Path:
    """``data`` at the library's ``name`` in ``directory`` with ``mode``, and beside it, unless
    None, ``recorded`` as its digest (what a build records)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data)
    path.chmod(mode)
    if recorded is not None:
        (directory / f"{path.name}.sha256").write_text(recorded + "\n")
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_directory_is_made_private_and_the_build_recorded(tmp_path, name) -> None:
    """A fresh cache directory: ``kernels/`` is made 0700, the library built is only its owner's
    to write, and the digest recorded beside it is its bytes'."""
    assert load(tmp_path).kvp_gather is not None
    directory = tmp_path / "kernels"
    library = directory / name
    assert directory.stat().st_mode & 0o777 == 0o700 and library.stat().st_mode & 0o022 == 0
    assert (directory / f"{library.name}.sha256").read_text().strip() == sha256(library.read_bytes())


FILES = {
    "not built here (no digest recorded)": {},
    "a digest another build recorded": {"recorded": sha256(b"another build")},
    "group-writable": {"mode": 0o770, "recorded": "own"},
    "other-writable": {"mode": 0o702, "recorded": "own"},
}


@pytest.mark.parametrize("kind", FILES, ids=list(FILES))
def test_a_planted_library_is_never_loaded_and_is_built_over(tmp_path, name, planted, kind, caplog) -> None:
    """A library at the name, of each untrusted kind: its constructor never runs; the server's own
    build takes its place (it has ``kvp_gather``, which the planted one lacks), with a warning."""
    data, marker = planted
    options = dict(FILES[kind])
    if options.get("recorded") == "own":
        options["recorded"] = sha256(data)
    path = plant(tmp_path / "kernels", name, data, **options)
    with caplog.at_level(logging.WARNING, logger="engine.kernels.build"):
        lib = load(tmp_path)
    assert not marker.exists()
    assert lib.kvp_gather is not None and path.read_bytes() != data
    assert any("not loaded" in r.getMessage() for r in caplog.records)


def test_a_link_at_the_name_is_never_followed(tmp_path, name, planted) -> None:
    """The name a symbolic link to a planted library (its digest recorded): never loaded."""
    data, marker = planted
    elsewhere = plant(tmp_path / "elsewhere", name, data)
    (tmp_path / "kernels").mkdir(mode=0o700)
    (tmp_path / "kernels" / elsewhere.name).symlink_to(elsewhere)
    (tmp_path / "kernels" / f"{elsewhere.name}.sha256").write_text(sha256(data))
    assert load(tmp_path).kvp_gather is not None and not marker.exists()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777], ids=oct)
def test_a_directory_others_can_write_is_never_loaded_from(tmp_path, name, planted, mode) -> None:
    """``kernels/`` writable by group or others, holding a planted library whose every other check
    passes: refused (``KernelUnavailable``, naming why), nothing loaded, nothing built there."""
    data, marker = planted
    directory = tmp_path / "kernels"
    path = plant(directory, name, data, recorded=sha256(data))
    directory.chmod(mode)
    with pytest.raises(KernelUnavailable, match="writable by group or others"):
        load(tmp_path)
    assert not marker.exists() and path.read_bytes() == data


def test_a_linked_directory_is_never_loaded_from(tmp_path, name, planted) -> None:
    """``kernels`` a symbolic link to a directory holding a planted library: refused."""
    data, marker = planted
    plant(tmp_path / "theirs", name, data, recorded=sha256(data))
    (tmp_path / "theirs").chmod(0o700)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").symlink_to(tmp_path / "theirs")
    with pytest.raises(KernelUnavailable, match="not a directory"):
        load(tmp_path / "cache")
    assert not marker.exists()


@pytest.mark.parametrize("content", ["garbage", "no entry points"])
def test_a_library_that_cannot_be_loaded_is_a_clear_fallback(tmp_path, name, monkeypatch, content) -> None:
    """A library that passes every check yet does not load (garbage bytes; a library without the
    decode step's entry points) and cannot be built again (the compiler fails): ``KernelUnavailable``
    naming why, never another error."""
    cxx = compiler()
    assert cxx is not None
    data = b"garbage"
    if content == "no entry points":
        (tmp_path / "empty.cpp").write_text("int kvp_nothing = 1;\n")
        subprocess.run([cxx, "-shared", "-fPIC", "empty.cpp", "-o", "empty.so"], cwd=tmp_path, check=True)
        data = (tmp_path / "empty.so").read_bytes()
    failing = tmp_path / "failing-cxx"  # NOTE: the compiler's version (so the same name), no build
    failing.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {cxx} --version\nexit 1\n')
    failing.chmod(0o755)
    monkeypatch.setenv("CXX", str(failing))
    plant(tmp_path / "cache" / "kernels", name, data, recorded=sha256(data))
    with pytest.raises(KernelUnavailable, match="could not build"):
        load(tmp_path / "cache")


def test_the_engine_decodes_with_torch_and_warns_when_the_library_is_refused(tmp_path, caplog) -> None:
    """A model loaded with a cache directory whose ``kernels/`` others can write: no library, the
    reason kept, and the decode step picked is torch's, with a warning naming the reason."""
    (tmp_path / "cache" / "kernels").mkdir(parents=True)
    os.chmod(tmp_path / "cache" / "kernels", 0o777)
    loaded = load_model(str(build_tiny_model(tmp_path / "tiny")), cache_dir=tmp_path / "cache")
    assert loaded.kernels is None and "writable by group or others" in (loaded.kernel_error or "")
    like = torch.empty(0)
    with caplog.at_level(logging.WARNING, logger="engine.decoding"):
        decoder = pick_decoder(loaded, like, threads=1)
    assert "native" not in decoder.name
    assert any("writable by group or others" in r.getMessage() for r in caplog.records)
