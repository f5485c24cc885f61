"""Formats: which dtype the activations and K/V have, and what the decode step computes on.

``dtype``: ``float32`` (``auto``), ``bfloat16`` or ``float16``. ``weights``:

- ``source`` (what ``auto`` picks when it can): the block codes of the GGUF file the checkpoint
  came from (``engine.model.codes``), computed in float32 by the native decode step
  (``engine.kernels``). It is the source model exactly: the float32 checkpoint is those codes
  de-quantized, bit for bit, and prefill runs on it.
- ``full``: the checkpoint's own weights, for every step.

``source`` needs a GGUF source, float32, the CPU and a C++ compiler; ``auto`` falls back to
``full`` when one is missing, and says so. Both, and the device kind, are part of every cache
namespace: K/V computed in one format is never reused in another.
"""

from __future__ import annotations

import logging
from typing import Literal, cast, get_args

from engine.model.fetch import ModelError

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16", "float16"]
"""The activations' and K/V's dtype (a torch dtype's name)."""
DtypeChoice = Literal["auto", Dtype]
"""``--dtype``: a dtype, or ``auto`` (float32)."""
WeightFormat = Literal["source", "full"]
"""What the decode step computes on."""
WeightsChoice = Literal["auto", WeightFormat]
"""``--weights``: a weight format, or ``auto`` (``resolve_formats`` decides)."""
DTYPES: tuple[DtypeChoice, ...] = get_args(DtypeChoice)
WEIGHTS: tuple[WeightsChoice, ...] = get_args(WeightsChoice)


def resolve_formats(dtype: str, weights: str, device: str, source: str | None) -> tuple[Dtype, WeightFormat]:
    """``(dtype, weights)`` with ``auto`` decided: float32, and the source codes when
    ``source`` is None (the model has a GGUF source and a native step can be built), else full.

    Args:
        source: why the source format is out of reach here (no GGUF source, no compiler), or None.

    Raises:
        ModelError: an unknown value, or ``source`` asked for where it cannot run.
    """
    if dtype not in DTYPES:
        raise ModelError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if weights not in WEIGHTS:
        raise ModelError(f"weights {weights!r} is not one of {', '.join(WEIGHTS)}")
    dtype = "float32" if dtype == "auto" else dtype
    blocker = source
    if blocker is None and dtype != "float32":
        blocker = f"the source codes are computed in float32, not {dtype}"
    if blocker is None and device != "cpu":
        blocker = f"the source codes' kernels run on the CPU, not on {device}"
    if weights == "source" and blocker is not None:
        raise ModelError(f"--weights source is not available: {blocker} (use --weights full)")
    if weights == "auto":
        weights = "full" if blocker is not None else "source"
        if blocker is not None:
            log.info("weights: full (%s)", blocker)
    return cast(Dtype, dtype), cast(WeightFormat, weights)
