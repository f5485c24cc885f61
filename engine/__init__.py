"""Model loading, KV extraction/injection, prefill on a cached prefix, decode, the worker.

The engine never reads settings or the environment and never imports Redis: the proxy hands it
a loaded model and a ``store.interface.PrefixCache`` (or none, for ``--no-cache``).
"""
