"""``kvproxy route``: a cache-aware proxy in front of several OpenAI-compatible servers."""
