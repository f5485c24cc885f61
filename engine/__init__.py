"""The engine: model loading, the lookup stage, scheduling, forward passes, sampling, the worker.

One module per stage (a request passes through them in this order): ``requests`` (what goes in
and comes out), ``sequence`` (a request inside the engine), ``scheduler`` (queues, admission,
turn-taking), ``prefix_stage`` (the cached prefix becomes the past, off the model thread),
``runner`` (prefill chunks, batched decode, finishing; ``storing``: what it hands to the cache),
``forward``, ``decoding`` and ``sampling`` (the model calls), ``kv`` (blocks <-> the model's
past), ``worker`` (the thread that ties them together, and the ``parts`` its stages share);
``model/`` gets a model, ``kernels/`` builds the native decode step. The engine never reads
settings or the environment and never imports Redis: the proxy hands it a loaded model and a
``store.interface.PrefixCache`` (or none, for ``--no-cache``).
"""
