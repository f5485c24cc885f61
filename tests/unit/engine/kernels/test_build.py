"""The native decode step's library: built once per machine into the cache directory, and built
again when the file there no longer loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.kernels.build import compiler, load

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler")


def test_a_damaged_library_is_built_again(tmp_path) -> None:
    # NOTE: built by another process: a library this process loaded stays loaded under its name
    build = f"from pathlib import Path; from engine.kernels.build import load; load(Path({str(tmp_path)!r}))"
    subprocess.run([sys.executable, "-c", build], check=True)
    (built,) = (tmp_path / "kernels").glob("decode-*.so")
    built.write_bytes(b"garbage")  # e.g. a full disk, or a cache directory copied in part
    assert load(tmp_path).kvp_decode is not None
    assert built.stat().st_size > len(b"garbage")
