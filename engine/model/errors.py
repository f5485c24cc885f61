"""The one error of model resolution, fetching, conversion and loading."""

from __future__ import annotations


class ModelError(Exception):
    """A model cannot be found, fetched, converted or served; the message says what to do."""
