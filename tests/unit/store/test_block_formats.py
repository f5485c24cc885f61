"""store/codec.py through store/serde.py: the exact format gives back every bit, a blob written
before block formats (version 1) is still read, and the lossy formats are bounded, smaller and
never taken for another format."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hashing import BLOCK_SIZE
from store import codec
from store.block_format import BLOCK_FORMATS
from store.interface import KVBlock
from store.serde import BlockVerificationError, decode_block, encode_block
from tests.helpers import SPEC, as_version_1
from tests.unit.store.test_serde import HASHES, IDS, NS, block

FORMATS = {name: dataclasses.replace(SPEC, block_format=name) for name in BLOCK_FORMATS}


def decode(data: bytes, spec=SPEC) -> KVBlock:  # type: ignore[no-untyped-def]
    ids = IDS[BLOCK_SIZE:]
    return decode_block(
        data, index=1, block_hash=HASHES[1], parent=HASHES[0], namespace=NS, token_ids=ids, spec=spec
    )


def test_a_version_1_blob_is_read_as_the_same_exact_block() -> None:
    original = block()
    old = as_version_1(encode_block(original, NS, HASHES[0], SPEC))
    back = decode(old)
    assert torch.equal(back.key, original.key) and torch.equal(back.value, original.value)
    for name in ("bfloat16", "int8"):
        with pytest.raises(BlockVerificationError, match="version-1 blob of the exact format"):
            decode(old, FORMATS[name])


@pytest.mark.parametrize("name", BLOCK_FORMATS)
def test_each_format_decodes_to_its_round_trip_and_is_never_read_as_another(name: str) -> None:
    spec, original = FORMATS[name], block()
    back = decode(encode_block(original, NS, HASHES[0], spec), spec)
    key, value = codec.round_trip(original.key, original.value, name)
    assert torch.equal(back.key, key) and torch.equal(back.value, value)
    assert back.key.dtype == torch.float32 and back.key.shape == original.key.shape
    for other in BLOCK_FORMATS:
        if other != name:
            with pytest.raises(BlockVerificationError, match="format"):
                decode(encode_block(original, NS, HASHES[0], spec), FORMATS[other])


def test_the_lossy_formats_are_bounded_and_smaller() -> None:
    """bfloat16 rounds each value to 8 bits of mantissa; int8 is within half a step of its slice's
    range (K per channel, V per token); with the default model's head_dim, the blobs take about a
    half and a third of the bytes."""
    original = block()
    x = original.key
    key, _ = codec.round_trip(x, original.value, "bfloat16")
    assert ((key - x).abs() <= x.abs() * 2**-8).all()
    key, value = codec.round_trip(x, original.value, "int8")
    step_k = (x.amax(dim=2, keepdim=True) - x.amin(dim=2, keepdim=True)) / 255
    v = original.value
    step_v = (v.amax(dim=3, keepdim=True) - v.amin(dim=3, keepdim=True)) / 255
    assert ((key - x).abs() <= step_k * 0.5 + 1e-6).all() and ((value - v).abs() <= step_v * 0.5 + 1e-6).all()
    wide = dataclasses.replace(SPEC, head_dim=64)
    big = KVBlock(
        1, HASHES[1], original.token_ids, torch.randn(wide.block_shape), torch.randn(wide.block_shape)
    )
    size = {
        f: len(encode_block(big, NS, HASHES[0], dataclasses.replace(wide, block_format=f))) for f in FORMATS
    }
    assert size["bfloat16"] < 0.55 * wide.block_bytes and size["int8"] < 0.35 * wide.block_bytes


def test_a_constant_slice_quantizes_exactly() -> None:
    """A channel whose K is the same at every token (scale 0) decodes to that value."""
    x = torch.full(SPEC.block_shape, 0.25)
    key, value = codec.round_trip(x, x, "int8")
    assert torch.equal(key, x) and torch.equal(value, x)


def test_packed_bytes_that_do_not_unpack_fail_verification() -> None:
    data = bytearray(encode_block(block(), NS, HASHES[0], SPEC))
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    with pytest.raises(BlockVerificationError):
        decode(bytes(data))
