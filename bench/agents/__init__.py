"""Issue 46's check on real agents: ``python -m bench.agents`` (see ``__main__``)."""
