"""hashing/: full blocks only, chained, rooted in the namespace, the same in every process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import xxhash

from hashing import (
    BLOCK_SIZE,
    NamespaceIdentity,
    block_hashes,
    block_tokens,
    encode_token_ids,
    num_full_blocks,
    reusable_tokens,
)

NS = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t").digest()
IDS = list(range(1000, 1000 + 3 * BLOCK_SIZE + 5))


def test_partial_last_block_is_never_hashed() -> None:
    """127 tokens give no block; 128 give one; 3*128+5 give three."""
    assert block_hashes(IDS[:127], NS) == []
    assert len(block_hashes(IDS[:128], NS)) == 1
    assert len(block_hashes(IDS, NS)) == 3


def test_chain_follows_the_design_rule() -> None:
    """h0 = xxh3_128(N || ids[0:128] LE uint32); hi = xxh3_128(h(i-1) || ids[128i:128i+128])."""
    hashes = block_hashes(IDS, NS)
    expected0 = xxhash.xxh3_128_digest(NS + encode_token_ids(IDS[:128]))
    expected1 = xxhash.xxh3_128_digest(expected0 + encode_token_ids(IDS[128:256]))
    assert hashes[0] == expected0 and hashes[1] == expected1
    assert all(len(h) == 16 for h in hashes)


def test_token_ids_are_little_endian_uint32() -> None:
    """Encoding does not depend on the platform."""
    assert encode_token_ids([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_a_block_hash_depends_on_everything_before_it() -> None:
    """Changing one token of block 0 changes every later hash; changing block 2 keeps 0 and 1."""
    base = block_hashes(IDS, NS)
    early = block_hashes([IDS[0] + 1, *IDS[1:]], NS)
    late = [*IDS[:300], IDS[300] + 1, *IDS[301:]]
    assert all(a != b for a, b in zip(base, early, strict=True))
    assert block_hashes(late, NS)[:2] == base[:2] and block_hashes(late, NS)[2] != base[2]


def test_same_tokens_at_another_position_get_another_hash() -> None:
    """Block identity includes its position through the chain."""
    block = IDS[:128]
    assert block_hashes(block + block, NS)[1] != block_hashes(block, NS)[0]


def test_namespaces_separate_models_dtypes_tenants_and_formats() -> None:
    """Each namespace field changes every block hash."""
    variants = [
        NamespaceIdentity(model_fingerprint="other", kv_dtype="float32", tenant="t").digest(),
        NamespaceIdentity(model_fingerprint="m", kv_dtype="bfloat16", tenant="t").digest(),
        NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="u").digest(),
        NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t", block_size=64).digest(),
        NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t", format_version=99).digest(),
    ]
    assert len({NS, *variants}) == 6
    base = block_hashes(IDS, NS)
    for ns in variants:
        assert not set(block_hashes(IDS, ns)) & set(base)


def test_hashes_are_the_same_in_another_process() -> None:
    """No process-dependent input (e.g. Python's hash randomisation) enters a hash."""
    code = (
        "from hashing import block_hashes, NamespaceIdentity;"
        "ns = NamespaceIdentity(model_fingerprint='m', kv_dtype='float32', tenant='t').digest();"
        f"print(','.join(h.hex() for h in block_hashes(list(range(1000, {1000 + len(IDS)})), ns)))"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout.strip()
        assert out == ",".join(h.hex() for h in block_hashes(IDS, NS))


def test_block_i_holds_tokens_128i_to_128i_plus_128() -> None:
    """block_tokens slices exactly one block; the hash of block i covers exactly those ids."""
    assert block_tokens(IDS, 0) == tuple(IDS[:128])
    assert block_tokens(IDS, 2) == tuple(IDS[256:384])
    assert block_tokens(IDS, 3) == tuple(IDS[384:])  # the partial last block, never hashed
    chained = xxhash.xxh3_128_digest(block_hashes(IDS, NS)[1] + encode_token_ids(block_tokens(IDS, 2)))
    assert block_hashes(IDS, NS)[2] == chained


@pytest.mark.parametrize(
    ("n", "cached_blocks", "expected"),
    [
        (300, 2, 256),  # a partial hit leaves the rest of the prompt to compute
        (256, 2, 255),  # a full hit on whole blocks: the last token is always computed
        (257, 2, 256),
        (128, 1, 127),
        (127, 0, 0),
        (1, 0, 0),
        (0, 0, 0),
        (1000, 0, 0),
    ],
)
def test_reuse_is_capped_at_n_minus_one(n: int, cached_blocks: int, expected: int) -> None:
    """reusable_tokens = min(128 k, n - 1): what the engine reuses and cached_tokens reports."""
    assert reusable_tokens(n, cached_blocks) == expected


def test_full_blocks() -> None:
    assert [num_full_blocks(n) for n in (0, 127, 128, 255, 256, 1000)] == [0, 0, 1, 1, 2, 7]
