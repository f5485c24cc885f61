"""The prefix KV cache: a Redis index of blocks plus a safetensors blob store.

``store.interface`` holds the contracts and value types; ``index``, ``blobs`` and ``serde`` are the
parts; ``cache.BlockCache`` is the facade the engine is handed.
"""

from store.interface import KVBlock, KVSpec, PrefixCache, PrefixMatch

__all__ = ["KVBlock", "KVSpec", "PrefixCache", "PrefixMatch"]
