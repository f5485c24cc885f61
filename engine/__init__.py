"""The engine: model loading, the lookup stage, scheduling, forward passes, sampling, the worker.

One module per stage (a request passes through them in this order): ``requests`` (what goes in
and comes out), ``scheduler`` (queues, admission, turn-taking), ``loader`` (the cached prefix
becomes the past, off the model thread), ``runner`` (prefill chunks, batched decode, finishing),
``forward`` and ``sampling`` (the model calls), ``kv`` (blocks <-> the model's past), ``worker``
(the thread that ties them together). The engine never reads settings or the environment and
never imports Redis: the proxy hands it a loaded model and a ``store.interface.PrefixCache`` (or
none, for ``--no-cache``).
"""
