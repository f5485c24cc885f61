"""Block formats through a real server (tiny model, real Redis, file blobs): a store written before
block formats is still served, bit for bit; a lossy format's blocks are a namespace of their own,
and the audit measures what they cost (``/stats``)."""

from __future__ import annotations

import httpx

from hashing import BLOCK_SIZE
from tests.api import Api, audited
from tests.helpers import as_version_1, random_tokens


def test_a_store_written_before_block_formats_is_still_served(settings, tiny_model, serve, cold) -> None:
    """Every blob (blocks and tails) rewritten as version 1: a new process with no RAM tier reads
    them all, verifies them, and answers bit for bit as it did from the version-2 blobs (and with
    the --no-cache server's tokens)."""
    prompt = random_tokens(3 * BLOCK_SIZE + 20, seed=801)
    with serve(settings, tiny_model) as server:
        api = Api(server)
        api.complete(prompt)
        api.flush()
    from_disk = settings.model_copy(update={"ram_cache_bytes": 0})
    with serve(from_disk, tiny_model) as server:
        before = Api(server).complete(prompt)
    paths = sorted(settings.blob_root.rglob("*.safetensors"))
    assert len(paths) >= 4  # three blocks, the prompt's tail and the answer's
    for path in paths:
        path.write_bytes(as_version_1(path.read_bytes(), tiny_model.kv_spec))
    with serve(from_disk, tiny_model) as server:
        api = Api(server)
        hit = api.complete(prompt)
        stats = api.cache.admin.stats()
    assert hit.cached_tokens == before.cached_tokens == len(prompt) - 1 and stats.verification_failures == 0
    assert hit.first_logprobs == before.first_logprobs and hit.token_ids == before.token_ids
    assert hit.token_ids == cold.complete(prompt).token_ids


def test_an_int8_store_is_its_own_namespace_and_audited(settings, tiny_model, serve) -> None:
    """--block-format int8 --audit-rate 1: hits are served from int8 blocks, every one audited,
    and /stats reports the format, the checks, the mismatches and divergences, and a logit
    difference above zero (the blocks are lossy); an exact server on the same store reuses none."""
    prompt = random_tokens(3 * BLOCK_SIZE + 7, seed=802)
    lossy = settings.model_copy(update={"audit_rate": 1.0, "block_format": "int8", "no_tails": True})
    with serve(lossy, tiny_model) as server:
        api = Api(server)
        api.complete(prompt)
        api.flush()
        hits = [api.complete(prompt + random_tokens(3, seed=i)).cached_tokens for i in range(6)]
        audit = audited(server)
        blob_bytes = api.cache.admin.usage()[1]
    assert hits[0] == 3 * BLOCK_SIZE and audit["block_format"] == "int8"
    assert audit["checks"] == sum(1 for h in hits if h) and audit["pending"] == 0
    assert audit["mismatches"] == sum(r["mismatch"] for r in audit["recent"])
    assert audit["divergences"] == sum(r["diverged"] for r in audit["recent"])
    assert 0 < audit["max_logit_difference"]
    assert blob_bytes < 3 * tiny_model.kv_spec.block_bytes * 0.5
    with serve(settings, tiny_model) as server:
        assert Api(server).complete(prompt).cached_tokens == 0
        doc = httpx.get(f"{server.base_url}/stats").json()
        assert doc["audit"]["block_format"] == "exact"
