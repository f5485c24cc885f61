"""The prefix KV cache: a block index (Redis) plus a blob store (safetensors), behind a facade.

Nothing is imported here, so ``import store.index.redis.connect`` (the router, the command line)
loads no torch. The rooms:

- ``interface``, ``admin_interface``: the contracts (``PrefixCache`` for the engine, ``CacheAdmin``
  for the server); ``outcomes``, ``stats``, ``errors``: typed results.
- ``cache`` (the facade), ``lookup``, ``writer``, ``ram``, ``serde``, ``admin``, ``gc``,
  ``report``: the cache itself; ``parts`` what they share; ``open`` the backends by URL.
- ``index/``: the block index (``base`` contracts, ``redis/``, ``memory/``).
- ``blobs/``: the blob store (``base`` contract, ``file``, ``s3``).
- ``snapshot/``: portable archives (``format``, ``export``, ``importer``).
"""
