"""Portable snapshots: blocks exported from one deployment (its own Redis keys and blob
directory) are hits in another after import; snapshots of another model are refused naming the
field; damaged or tampered blocks are rejected and reported while the rest are imported."""

from __future__ import annotations

import io
import json
import tarfile
import threading

import httpx
import pytest
import xxhash
from click.testing import CliRunner
from redis.connection import AbstractConnection

from engine.model.loading import load_model
from hashing import BLOCK_SIZE, block_hashes
from proxy.cli import main
from tests.api import Api
from tests.helpers import HANG_S, build_tiny_model, random_tokens


@pytest.fixture
def other(settings, tmp_path):
    """A second deployment: its own key prefix and blob directory (same Redis server)."""
    return settings.model_copy(
        update={"key_prefix": settings.key_prefix + "other:", "blob_dir": tmp_path / "other"}
    )


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["cache", *args])
    return result.exit_code, result.output


def export(server, tmp_path, prompts: list[list[int]], name: str = "snap.tar") -> tuple[dict, bytes]:
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / name
    code, output = cli(
        "export",
        "--prompts",
        str(tmp_path / "prompts.jsonl"),
        "--out",
        str(out),
        "--base-url",
        f"{server.base_url}/v1",
    )
    assert code == 0, output
    return json.loads(output), out.read_bytes()


def rewrite(archive: bytes, change) -> bytes:
    """The archive with ``change(name, data) -> data`` applied to each member."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            data = change(member.name, src.extractfile(member).read())
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out.getvalue()


def import_bytes(server, archive: bytes) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/cache/import", content=archive, timeout=120)


def test_a_snapshot_moves_hits_to_a_fresh_deployment(settings, other, tiny_model, serve, tmp_path) -> None:
    """Export by prompt from A, import into B (empty): B's first request is a hit with A's answer."""
    prompt, second = random_tokens(600, seed=81), random_tokens(300, seed=82)
    with serve(settings, tiny_model) as a:
        expected = Api(a).complete([*prompt, 1, 2])
        Api(a).complete(second)
        Api(a).flush()
        made, archive = export(a, tmp_path, [prompt, second + random_tokens(300, seed=1)])
    assert (made["blocks"], made["skipped"]) == (4 + 2, 0)  # blocks never cached are not "skipped"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {k: manifest[k] for k in ("kind", "block_size", "kv_dtype", "weights", "tenant")} == {
        "kind": "kvproxy-cache-snapshot",
        "block_size": 128,
        "kv_dtype": "float32",
        "weights": "full",
        "tenant": "default",
    }
    assert manifest["model_fingerprint"] == tiny_model.fingerprint and len(manifest["blocks"]) == 6
    with serve(other, tiny_model) as b:
        assert b.app.state.cache.usage() == (0, 0)
        code, output = cli("import", str(tmp_path / "snap.tar"), "--base-url", f"{b.base_url}/v1")
        assert code == 0, output
        report = json.loads(output)
        assert (report["imported"], report["already_cached"], report["rejected"]) == (6, 0, [])
        hit = Api(b).complete([*prompt, 1, 2])
        assert hit.cached_tokens == 4 * BLOCK_SIZE and hit.key == expected.key
        assert Api(b).complete(second).cached_tokens == 2 * BLOCK_SIZE
        again = import_bytes(b, archive).json()
        assert (again["imported"], again["already_cached"]) == (0, 6)


def test_a_snapshot_of_another_model_is_refused(settings, other, tiny_model, serve, tmp_path) -> None:
    """Another checkpoint (another fingerprint): 400 naming model_fingerprint; nothing stored."""
    foreign = load_model(str(build_tiny_model(tmp_path / "foreign", seed=9)), cache_dir=tmp_path)
    with serve(settings, tiny_model) as a:
        Api(a).complete(random_tokens(300, seed=83))
        Api(a).flush()
        export(a, tmp_path, [random_tokens(300, seed=83)])
    with serve(other, foreign) as b:
        code, output = cli("import", str(tmp_path / "snap.tar"), "--base-url", f"{b.base_url}/v1")
        assert code == 1 and "model_fingerprint" in output and foreign.fingerprint in output
        assert b.app.state.cache.usage() == (0, 0)
        bad = import_bytes(b, b"not a tar archive at all")
        assert bad.status_code == 400 and "not a kvproxy snapshot" in bad.json()["error"]["message"]


def test_damaged_and_tampered_blocks_are_rejected_the_rest_imported(
    settings, other, tiny_model, serve, tmp_path
) -> None:
    """One block's bytes flipped (the manifest's digest catches it, and its child is rejected with
    it: it could never be served); another chain's block changed with the digest updated to match
    (the block's own checksum catches it): all three reported, the other 5 imported, and each
    chain served up to its first rejected block."""
    prompt, other_prompt = random_tokens(700, seed=84), random_tokens(400, seed=90)
    with serve(settings, tiny_model) as a:
        Api(a).complete(prompt)
        Api(a).complete(other_prompt)
        Api(a).flush()
        _, archive = export(a, tmp_path, [prompt, other_prompt])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        blocks = json.load(tar.extractfile("manifest.json"))["blocks"]
    assert [b["index"] for b in blocks] == [0, 1, 2, 3, 4, 0, 1, 2]
    damaged, child, tampered = blocks[3]["hash"], blocks[4]["hash"], blocks[7]["hash"]

    def change(name: str, data: bytes) -> bytes:
        if damaged in name:
            return data[:-100] + bytes(b ^ 0xFF for b in data[-100:])
        if tampered in name:
            return data[:-200] + bytes(200)
        return data

    changed = rewrite(archive, change)

    def fix_digest(name: str, data: bytes) -> bytes:
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        with tarfile.open(fileobj=io.BytesIO(changed)) as tar:
            blob = tar.extractfile(f"blocks/{tampered}.safetensors").read()
        for block in manifest["blocks"]:
            if block["hash"] == tampered:
                block["xxh3_128"] = xxhash.xxh3_128_hexdigest(blob)
        return json.dumps(manifest).encode()

    with serve(other, tiny_model) as b:
        report = import_bytes(b, rewrite(changed, fix_digest)).json()
        assert report["imported"] == 5
        reasons = {r["hash"]: r["reason"] for r in report["rejected"]}
        assert set(reasons) == {damaged, child, tampered}
        # NOTE: the tampered bytes fail to unpack, or unpack and fail the checksum
        assert "digest" in reasons[damaged] and "corrupt file" in reasons[tampered]
        assert "parent block was rejected" in reasons[child]
        assert Api(b).complete(prompt).cached_tokens == 3 * BLOCK_SIZE
        assert Api(b).complete(other_prompt).cached_tokens == 2 * BLOCK_SIZE


def test_export_all_of_a_tenant_with_the_admin_key(settings, other, tiny_model, serve, tmp_path) -> None:
    """--all --tenant: every block of that tenant, none of another's; export and import need the
    admin key."""
    keyed = settings.model_copy(update={"api_keys": "ka=alpha,kb=beta", "admin_key": "adm"})
    with serve(keyed, tiny_model) as a:
        for key, seed in (("ka", 85), ("ka", 86), ("kb", 87)):
            prompt = random_tokens(300, seed=seed)
            r = httpx.post(
                f"{a.base_url}/v1/completions",
                json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            )
            assert r.status_code == 200
        Api(a).flush()
        args = [
            "export",
            "--all",
            "--tenant",
            "alpha",
            "--out",
            str(tmp_path / "a.tar"),
            "--base-url",
            f"{a.base_url}/v1",
        ]
        code, output = cli(*args, "--api-key", "ka")
        assert code == 1 and "admin" in output.lower()
        code, output = cli(*args, "--api-key", "adm")
        assert code == 0 and json.loads(output)["blocks"] == 4
    with serve(other.model_copy(update={"api_keys": "ka=alpha", "admin_key": "adm"}), tiny_model) as b:
        code, output = cli(
            "import", str(tmp_path / "a.tar"), "--base-url", f"{b.base_url}/v1", "--api-key", "adm"
        )
        assert code == 0 and json.loads(output)["imported"] == 4
        r = httpx.post(
            f"{b.base_url}/v1/completions",
            json={"model": "tiny", "prompt": random_tokens(300, seed=86), "max_tokens": 1},
            headers={"Authorization": "Bearer ka"},
            timeout=120,
        )
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 2 * BLOCK_SIZE


def test_malformed_manifests_and_unknown_tenants_are_clear_errors(
    settings, other, tiny_model, serve, tmp_path
) -> None:
    """A manifest whose `blocks` is not a list: 400; malformed entries: rejected one by one; a
    tenant the server does not serve, on export or import: 400 naming its tenants; nothing cached
    to export: 404, and the command exits 1 without writing a file."""
    prompt = random_tokens(300, seed=88)
    with serve(settings, tiny_model) as a:
        Api(a).complete(prompt)
        Api(a).flush()
        _, archive = export(a, tmp_path, [prompt])
        r = httpx.post(f"{a.base_url}/v1/cache/export", json={"all": True, "tenant": "nobody"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_tenant"
        assert "its tenants: default" in r.json()["error"]["message"]
        (tmp_path / "none.jsonl").write_text(json.dumps({"prompt": random_tokens(300, seed=89)}) + "\n")
        out = tmp_path / "none.tar"
        code, output = cli(
            "export",
            "--prompts",
            str(tmp_path / "none.jsonl"),
            "--out",
            str(out),
            "--base-url",
            f"{a.base_url}/v1",
        )
        assert code == 1 and "nothing to export" in output and not out.exists()

    def manifest_with(**changes):
        def change(name: str, data: bytes) -> bytes:
            return json.dumps(json.loads(data) | changes).encode() if name == "manifest.json" else data

        return rewrite(archive, change)

    with serve(other.model_copy(update={"api_keys": "ka=alpha", "admin_key": "adm"}), tiny_model) as b:
        admin = {"Authorization": "Bearer adm"}
        r = httpx.post(f"{b.base_url}/v1/cache/import", content=archive, headers=admin, timeout=120)
        assert (
            r.status_code == 400
            and "tenant 'default' is not a tenant of this server" in r.json()["error"]["message"]
        )
    with serve(other, tiny_model) as b:
        for blocks in ("abc", {"a": 1}, None):
            r = import_bytes(b, manifest_with(blocks=blocks))
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_snapshot", blocks
        for changes in ({"tenant": None}, {"block_size": 128.0}, {"snapshot_version": True}):
            r = import_bytes(b, manifest_with(**changes))
            assert r.status_code == 400, changes
        nested = rewrite(archive, lambda n, d: b"[" * 100_000 + b"]" * 100_000 if n == "manifest.json" else d)
        r = import_bytes(b, nested)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_snapshot"
        entries = [
            1,
            None,
            {"hash": "zz"},
            {"hash": "0" * 32, "index": "x", "xxh3_128": "y"},
            {"hash": "0" * 32, "index": 0},
        ]
        report = import_bytes(b, manifest_with(blocks=entries)).json()
        assert report["imported"] == 0 and len(report["rejected"]) == 5
        assert all("manifest entry" in r["reason"] for r in report["rejected"])
        assert b.app.state.cache.usage() == (0, 0)


def test_an_import_is_published_as_saves_are(
    settings, other, tiny_model, serve, tmp_path, monkeypatch
) -> None:
    """Imported blocks go through the writer: counted as saved (here and deployment-wide), kept in
    the RAM tier, and indexed in a fixed number of Redis round trips per batch, not per block."""
    prompt = random_tokens(6 * BLOCK_SIZE + 1, seed=90)
    with serve(settings, tiny_model) as a:
        Api(a).complete(prompt)
        Api(a).flush()
        export(a, tmp_path, [prompt])
    with serve(other, tiny_model) as b:
        cache = b.app.state.engine.cache
        saved = cache.admin.stats().blocks_saved
        trips = count_round_trips(monkeypatch)
        identities = {"default": tiny_model.identity("default")}
        with open(tmp_path / "snap.tar", "rb") as source:
            report = cache.admin.import_snapshot(source, identities)
        assert (report.imported, report.rejected) == (6, [])
        assert len(trips) <= 6, trips  # exists + namespace set + one publish script + the budget's sums
        assert cache.flush(HANG_S)
        assert cache.admin.stats().blocks_saved == saved + 6
        assert cache.admin.deployment_stats(tiny_model.namespace("default")).totals["blocks_saved"] == 6
        hashes = block_hashes(prompt, tiny_model.namespace("default"))
        assert all(cache.parts.ram.get(tiny_model.namespace("default"), h) is not None for h in hashes)


def count_round_trips(monkeypatch) -> list[str]:
    """The commands (the first of each pipeline) this thread sends to Redis from now on: one per
    round trip."""
    sent: list[str] = []
    me, real = threading.get_ident(), AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        if threading.get_ident() == me:
            first = command[0] if isinstance(command, list) else command
            sent.append(bytes(first)[:40].decode(errors="replace").split("\r\n")[2])
        return real(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent
