"""What the serving core knows of the served model, besides its tokenizer: names, vocabulary size,
context length and where a tenant's blocks are cached. Functions under ``proxy/serving/`` and
``proxy/tools/`` take these and a tokenizer, never the engine, so they run without a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from hashing import Namespace

if TYPE_CHECKING:
    from engine.model.loading import LoadedModel
    from engine.worker import Engine


@dataclass(frozen=True)
class ModelFacts:
    """The served model's facts.

    Attributes:
        name: the id served in ``/v1/models``.
        served_names: every name requests may use (``name`` first, then the aliases).
        vocab_size: token ids are in ``[0, vocab_size)``.
        context_length: most tokens of a prompt and its completion together.
        namespace: a tenant's cache namespace (``engine.model.loading.LoadedModel.namespace``).
    """

    name: str
    served_names: tuple[str, ...]
    vocab_size: int
    context_length: int
    namespace: Callable[[str], Namespace]


def model_facts(loaded: LoadedModel) -> ModelFacts:
    """The facts of a loaded model (cheap: a few attribute reads)."""
    return ModelFacts(
        loaded.name,
        loaded.served_names,
        loaded.model.config.vocab_size,
        loaded.context_length,
        loaded.namespace,
    )


class Served(NamedTuple):
    """The served model as the core sees it: its tokenizer (with the chat template) and facts."""

    tokenizer: Any
    facts: ModelFacts


def served_model(engine: Engine) -> Served:
    """The tokenizer and the facts of the model ``engine`` serves."""
    return Served(engine.loaded.tokenizer, model_facts(engine.loaded))
