"""Errors the cache raises to the callers that must know (the administrative side): everything
else it meets becomes a miss or a skipped save."""


class StoreUnavailable(Exception):
    """The index (Redis) failed during an operation that cannot degrade to a miss (clearing,
    exporting, importing); the message says what failed."""
