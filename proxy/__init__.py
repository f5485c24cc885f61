"""The OpenAI-compatible HTTP server, its settings and the ``kvproxy`` command line."""
