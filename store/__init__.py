"""The prefix KV cache: a block index (Redis) plus a blob store (safetensors), behind a facade.

Nothing is imported here, so ``import store.index.redis.connect`` (the router, the command line)
loads no torch. The rooms:

- ``interface``, ``admin_interface``: the contracts (``PrefixCache`` for the engine, ``CacheAdmin``
  for the server); ``outcomes``, ``stats``, ``errors``: typed results; ``block_format``: the
  block formats' names.
- ``cache`` (the facade), ``lookup``, ``tails`` (a lookup's tail), ``readers`` (its reader
  threads), ``writer`` (the one path blocks enter by), ``stored`` (what it publishes), ``counts``,
  ``ram``, ``serde`` (a block <-> its blob, verified), ``codec`` (the block formats' arrays),
  ``blob_view``, ``entries``, ``admin``, ``gc``, ``report``: the cache itself; ``parts`` what they
  share; ``guard``, ``breaker``, ``background``; ``open`` the backends by URL.
- ``index/``: the block index (``base`` and ``pins`` contracts, ``retention``, ``redis/``,
  ``memory/``, ``embedded/``).
- ``blobs/``: the blob store (``base`` contract, ``file``, ``s3``, ``tiered``).
- ``snapshot/``: portable archives (``format``, ``export``, ``importer``).
"""
