"""``memory://`` needs no Redis: the in-memory index (its pins, hot prefixes and counters with it)
and the index's contracts load no Redis client, checked in a fresh process on ``sys.modules``
(``lint-imports`` checks the same statically)."""

from __future__ import annotations

import subprocess
import sys


def test_the_memory_index_and_the_contracts_import_no_redis() -> None:
    """Importing them, and making a ``MemoryIndex``, leaves ``redis`` unloaded."""
    code = (
        "import sys\n"
        "import store.index.base, store.index.pins, store.index.retention\n"
        "from store.index.memory.index import MemoryIndex\n"
        "MemoryIndex()\n"
        "print('redis' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert run.stdout.strip() == "False"


def test_opening_a_memory_index_imports_no_redis() -> None:
    """``store.open`` picks a backend by scheme without loading redis-py: ``memory://`` leaves it
    unloaded."""
    code = (
        "import sys\n"
        "from store.open import open_index\n"
        "open_index('memory://', key_prefix='kvproxy:', timeout_s=1.0)\n"
        "print('redis' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert run.stdout.strip() == "False"
