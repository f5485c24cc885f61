"""Values of settings that are not plain types: sizes in bytes (``Bytes``: ``20MB``, ``1.5GiB``)
and key settings that may name a file (``key_file``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_bytes(value: object) -> object:
    """``"20MB"``, ``"1.5 GiB"`` or ``"4096"`` as a number of bytes; other values unchanged."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]i?)?b?\s*", value.lower())
        if match is None:
            raise ValueError(f"{value!r} is not a size (e.g. 4096, 20MB, 1.5GiB)")
        return int(float(match.group(1)) * _UNITS[match.group(2) or ""])
    return value


Bytes = Annotated[int, BeforeValidator(parse_bytes)]


def key_file(value: str, flag: str) -> Path | None:
    """The file a key setting names, or None when the value is a key itself: an existing file, or
    a path (absolute, or from ``./``, ``../`` or ``~``), which must exist.

    NOTE: a missing file is an error, never the key: a key file not mounted yet must not turn its
    own path into a key anyone can read in the configuration.

    Raises:
        ValueError: a path to no file.
    """
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if value.startswith(("/", "./", "../", "~")):
        raise ValueError(f"{flag} names the file {value}, which does not exist")
    return None
