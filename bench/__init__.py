"""Benchmarks of OpenAI-compatible servers, from the outside: reproducible workloads
(``workloads``), a timed streaming client on httpx (``client``), the ``kvproxy bench`` command
(``cli``), and side-by-side scripts that write ``docs/benchmarks.md``.

This package imports none of hashing/, store/, engine/ or proxy/ (an import-linter contract
checks it): it measures any server the way a client sees it.
"""
