"""``resolve_formats``: what ``auto`` decides, and what an impossible format or device says."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.model.fetch import ModelError
from engine.model.formats import resolve_formats
from engine.model.loading import device_kind


def test_auto_is_float32_on_the_source_codes_where_they_can_run() -> None:
    assert resolve_formats("auto", "auto", "cpu", None) == ("float32", "source")
    assert resolve_formats("float32", "full", "cpu", None) == ("float32", "full")


@pytest.mark.parametrize(
    ("dtype", "device", "blocker", "why"),
    [
        ("auto", "cuda", None, "the source codes' kernels run on the CPU, not on cuda"),
        ("bfloat16", "cpu", None, "the source codes are computed in float32, not bfloat16"),
        ("auto", "cpu", "the model has no GGUF source", "the model has no GGUF source"),
    ],
)
def test_auto_falls_back_to_full_and_says_why_and_source_is_refused(
    dtype, device, blocker, why, caplog
) -> None:
    with caplog.at_level(logging.INFO, logger="engine.model.formats"):
        assert resolve_formats(dtype, "auto", device, blocker)[1] == "full"
    assert f"weights: full ({why})" in caplog.text
    with pytest.raises(ModelError, match="--weights source is not available"):
        resolve_formats(dtype, "source", device, blocker)


@pytest.mark.parametrize(("dtype", "weights"), [("int4", "auto"), ("auto", "int4"), ("float64", "full")])
def test_unknown_formats_are_refused(dtype, weights) -> None:
    with pytest.raises(ModelError, match="is not one of"):
        resolve_formats(dtype, weights, "cpu", None)


def test_a_device_that_is_not_there_is_refused_before_loading() -> None:
    """``--device``: a bad name, or a device this torch build or machine lacks, is one clear
    ``ModelError`` (the CLI prints it in one line), not a traceback from inside the load."""
    assert device_kind("cpu") == "cpu"
    with pytest.raises(ModelError, match="--device 'bogus' cannot be used here"):
        device_kind("bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="--device 'cuda' cannot be used here"):
            device_kind("cuda")
