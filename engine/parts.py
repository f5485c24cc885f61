"""``ModelParts``: what the model thread's stages compute with, made once by the worker and
handed to the runner and the auditor alike."""

from __future__ import annotations

from dataclasses import dataclass

from engine.buffers import BufferPool
from engine.decoding import Decoder
from engine.model.loading import LoadedModel
from store.interface import PrefixCache


@dataclass(frozen=True)
class ModelParts:
    """The model, the cache (None: ``--no-cache``), the pool of K/V buffers and the decode step
    (``engine.decoding.pick_decoder``), all used on the model thread only."""

    loaded: LoadedModel
    cache: PrefixCache | None
    buffers: BufferPool
    decoder: Decoder
