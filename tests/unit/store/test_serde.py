"""store/serde.py: a blob round-trips, and any mismatch with the request fails verification."""

from __future__ import annotations

import pickle

import pytest
import torch

from hashing import BLOCK_SIZE, NamespaceIdentity, block_hashes, tail_hash
from store.interface import KVBlock, KVSpec
from store.serde import BlockVerificationError, decode_block, decode_tail, encode_block

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


def tail(length: int = 40) -> tuple[KVBlock, bytes]:
    ids = tuple(range(1000, 1000 + length))
    layers, heads, _, dim = SPEC.block_shape
    torch.manual_seed(length)
    key, value = torch.randn(layers, heads, length, dim), torch.randn(layers, heads, length, dim)
    stored = KVBlock(2, tail_hash(HASHES[1], ids), ids, key, value)
    return stored, encode_block(stored, NS, HASHES[1], SPEC)


def decode_tail_of(data: bytes, **overrides: object) -> KVBlock:
    stored, _ = tail()
    expected: dict[str, object] = {
        "index": 2,
        "tail": stored.block_hash,
        "tip": HASHES[1],
        "namespace": NS,
        "length": 40,
        "token_ids": stored.token_ids,
        "spec": SPEC,
    }
    expected.update(overrides)
    return decode_tail(data, **expected)  # type: ignore[arg-type]


def test_a_tail_round_trips_and_serves_all_but_its_last_token() -> None:
    stored, data = tail()
    back = decode_tail_of(data)
    assert back.token_ids == stored.token_ids and torch.equal(back.key, stored.key)
    assert decode_tail_of(data, token_ids=stored.token_ids[:-1]).token_ids == stored.token_ids


@pytest.mark.parametrize(
    "override",
    [
        {"tip": HASHES[0]},
        {"index": 3},
        {"length": 39},
        {"namespace": NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="u").digest()},
        {"token_ids": tuple(range(1001, 1040))},
    ],
    ids=["tip", "index", "length", "namespace", "tokens"],
)
def test_a_tail_that_is_not_the_one_asked_for_fails(override: dict[str, object]) -> None:
    _, data = tail()
    with pytest.raises(BlockVerificationError):
        decode_tail_of(data, **override)


def test_a_tail_and_a_block_never_pass_for_each_other() -> None:
    _, data = tail()
    with pytest.raises(BlockVerificationError):
        decode(data)
    with pytest.raises(BlockVerificationError):
        decode_tail_of(encode_block(block(), NS, HASHES[0], SPEC), tail=HASHES[1], tip=HASHES[0], index=1)


def test_a_flipped_bit_in_a_tail_fails_its_checksum() -> None:
    _, data = tail()
    damaged = bytearray(data)
    damaged[-3] ^= 0x01
    with pytest.raises(BlockVerificationError, match="checksum"):
        decode_tail_of(bytes(damaged))
