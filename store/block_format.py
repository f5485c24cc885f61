"""The block formats: how a block's K/V is held at rest (``store.codec`` encodes and decodes
each), defined once here and used unchanged by the settings (``--block-format``), the K/V spec and
the namespace.

Imports nothing, so the settings (and ``kvproxy route``) read it without torch.
"""

from __future__ import annotations

from typing import Literal, get_args

BlockFormat = Literal["exact", "bfloat16", "int8"]
"""``exact``: the K/V's own bytes; ``bfloat16`` and ``int8``: lossy, in fewer bytes (part of the
namespace, so a lossy block is never served to an exact one)."""
BLOCK_FORMATS: tuple[BlockFormat, ...] = get_args(BlockFormat)
"""Block formats, the exact one first (the default)."""
