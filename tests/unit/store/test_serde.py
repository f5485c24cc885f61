"""store/serde.py: a blob round-trips, and any mismatch with the request fails verification."""

from __future__ import annotations

import pickle

import pytest
import torch

from hashing import BLOCK_SIZE, NamespaceIdentity, block_hashes
from store.interface import KVBlock, KVSpec
from store.serde import BlockVerificationError, decode_block, encode_block

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
NS = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t").digest()
IDS = list(range(2 * BLOCK_SIZE))
HASHES = block_hashes(IDS, NS)


def block(index: int = 1) -> KVBlock:
    torch.manual_seed(index)
    return KVBlock(
        index,
        HASHES[index],
        tuple(IDS[index * BLOCK_SIZE : (index + 1) * BLOCK_SIZE]),
        torch.randn(SPEC.block_shape),
        torch.randn(SPEC.block_shape),
    )


def decode(data: bytes, **overrides: object) -> KVBlock:
    expected: dict[str, object] = {
        "index": 1,
        "block_hash": HASHES[1],
        "parent": HASHES[0],
        "namespace": NS,
        "token_ids": IDS[BLOCK_SIZE:],
        "spec": SPEC,
    }
    expected.update(overrides)
    return decode_block(data, **expected)  # type: ignore[arg-type]


def test_round_trip_is_exact() -> None:
    """K, V and token ids come back bit for bit."""
    original = block()
    restored = decode(encode_block(original, NS, HASHES[0], SPEC))
    assert torch.equal(restored.key, original.key) and torch.equal(restored.value, original.value)
    assert restored.token_ids == original.token_ids and restored.block_hash == HASHES[1]


@pytest.mark.parametrize(
    "overrides",
    [
        {"token_ids": [7] * BLOCK_SIZE},  # a hash collision: other tokens under the same hash
        {"namespace": NamespaceIdentity(model_fingerprint="x", kv_dtype="float32", tenant="t").digest()},
        {"block_hash": HASHES[0]},
        {"parent": None},
        {"index": 0},
        {"spec": KVSpec(num_layers=3, num_kv_heads=2, head_dim=8, dtype="float32")},
        {"spec": KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype="bfloat16")},
    ],
    ids=["tokens", "namespace", "hash", "parent", "index", "shape", "dtype"],
)
def test_any_mismatch_fails_verification(overrides: dict[str, object]) -> None:
    with pytest.raises(BlockVerificationError):
        decode(encode_block(block(), NS, HASHES[0], SPEC), **overrides)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: b"\xff" * 64 + data[64:],
        lambda data: pickle.dumps({"key": [1, 2, 3]}),
        lambda data: b"",
        lambda data: data[:-100] + bytes(100),
    ],
    ids=["truncated", "random-header", "pickle", "empty", "tensor-bytes"],
)
def test_damaged_data_fails_verification(damage) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BlockVerificationError):
        decode(damage(encode_block(block(), NS, HASHES[0], SPEC)))
