"""Fixtures for proxy/'s unit tests: a tokenizer and model facts, no model."""

from __future__ import annotations

from typing import Any

import pytest

from hashing import Namespace
from proxy.serving.facts import ModelFacts
from tests.helpers import tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny models' tokenizer (ChatML template), built without a model."""
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def facts(tokenizer: Any) -> ModelFacts:
    """Facts of a model served as ``tiny`` with the tiny tokenizer and a 512-token context."""
    return ModelFacts("tiny", ("tiny", "alias"), len(tokenizer), 512, lambda tenant: Namespace(bytes(16)))
