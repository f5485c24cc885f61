"""Closed by default, tried as a hostile client would: the cache's contents are the operator's
(anonymous clients neither read nor write them), an import is a trust decision that can be
audited, archives are bounded before they are read, prompt text and other tenants' traffic never
leak, and secrets never reach a log."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time

import click
import httpx
import pytest
import xxhash
from click.testing import CliRunner

from hashing import BLOCK_SIZE, block_hashes
from proxy.flags import parse_settings, route_options
from proxy.router.settings import RouteSettings
from store.interface import KVBlock
from store.serde import encode_block
from store.snapshot.format import MANIFEST, add_member
from tests.api import Api
from tests.helpers import HANG_S, build_tiny_model, free_port, random_tokens, stored_tensors, wait_for

ADMIN = "the-admin-key"
PROMPT_A, PROMPT_B = random_tokens(3 * BLOCK_SIZE + 1, seed=301), random_tokens(3 * BLOCK_SIZE + 1, seed=302)


def closed(settings, **changes):
    """The server's settings as an operator leaves them: no opt-in to anonymous administration."""
    return settings.model_copy(update={"allow_anonymous_admin": False} | changes)


def export_archive(server, prompts: list[list[int]], key: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"prompts": [{"prompt": p} for p in prompts]}
    r = httpx.post(f"{server.base_url}/v1/cache/export", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.content


def import_archive(server, archive: bytes, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.base_url}/v1/cache/import", content=archive, headers=headers, timeout=120)


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def pack(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            add_member(tar, name, data)
    return out.getvalue()


# 1. Anyone can write the cache.


def test_the_cache_routes_refuse_anonymous_clients_by_default(settings, tiny_model, serve) -> None:
    """With no key configured (the default), every /v1/cache/* route that reads or writes cache
    contents is a 401 saying the server has no admin key and how to start it with one (a key sent
    or not), and changes nothing; prewarm and chat stay open."""
    with serve(closed(settings), tiny_model) as server:
        Api(server).complete(PROMPT_A)
        Api(server).flush()
        base = f"{server.base_url}/v1/cache"
        calls = [
            httpx.post(f"{base}/export", json={"all": True}, timeout=30),
            httpx.post(f"{base}/import", content=b"x" * 10, timeout=30),
            httpx.post(f"{base}/clear", timeout=30),
            httpx.post(f"{base}/gc", timeout=30),
            httpx.get(f"{base}/stats", timeout=30),
        ]
        calls.append(httpx.get(f"{base}/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30))
        assert [r.status_code for r in calls] == [401] * 6
        says = "this route needs the admin key and this server has none: start it with --admin-key"
        assert all(r.json()["error"]["message"].startswith(says) for r in calls), calls[0].json()
        # nothing cleared: 3 blocks and 2 tails (the prompt's last token; it and the 8 generated)
        assert server.app.state.cache.usage()[0] == 3 + 2
        prewarm = httpx.post(f"{base}/prewarm", json={"prompt": PROMPT_B}, timeout=60)
        assert prewarm.status_code == 200 and prewarm.json()["stored_blocks"] == 3


def test_the_admin_key_opens_them_and_a_tenant_key_does_not(settings, tiny_model, serve) -> None:
    """The admin key passes; a tenant's API key is a 403; the operator's explicit opt-in
    (--allow-anonymous-admin) opens them only while no key is configured."""
    keyed = closed(settings, admin_key=ADMIN, api_keys="tenant-key=t")
    with serve(keyed, tiny_model) as server:
        url = f"{server.base_url}/v1/cache/stats"
        assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert httpx.get(url, headers={"Authorization": "Bearer tenant-key"}).status_code == 403
        anonymous = httpx.get(url)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["message"] == "this route needs the admin key (--admin-key)"
    with serve(closed(settings, allow_anonymous_admin=True, admin_key=ADMIN), tiny_model) as server:
        assert httpx.get(f"{server.base_url}/v1/cache/stats").status_code == 401  # a key exists
    with serve(closed(settings, allow_anonymous_admin=True), tiny_model) as server:
        assert httpx.get(f"{server.base_url}/v1/cache/stats").status_code == 200


def forged(archive: bytes, victim: bytes, spec) -> bytes:
    """``victim``'s snapshot with each block's K/V replaced by ``archive``'s block of the same
    position, every hash, checksum and digest recomputed: it passes every verification."""
    theirs, mine = members(archive), members(victim)
    manifest = json.loads(mine[MANIFEST])
    donors = {
        b["index"]: theirs[f"blocks/{b['hash']}.safetensors"] for b in json.loads(theirs[MANIFEST])["blocks"]
    }
    namespace = bytes.fromhex(manifest["namespace"])
    files = {}
    for entry in manifest["blocks"]:
        _, tensors = stored_tensors(mine[f"blocks/{entry['hash']}.safetensors"], spec)
        _, donor = stored_tensors(donors[entry["index"]], spec)
        block = KVBlock(
            entry["index"],
            bytes.fromhex(entry["hash"]),
            tuple(tensors["token_ids"].tolist()),
            donor["key"],
            donor["value"],
        )
        parent = bytes.fromhex(entry["parent"]) if entry["parent"] else None
        data = encode_block(block, namespace, parent, spec)
        files[f"blocks/{entry['hash']}.safetensors"] = data
        entry |= {"bytes": len(data), "xxh3_128": xxhash.xxh3_128_hexdigest(data)}
    files[MANIFEST] = json.dumps(manifest).encode()
    return pack(files)


def test_an_audited_import_serves_only_what_the_model_confirms(
    settings, tiny_model, serve, cold, tmp_path
) -> None:
    """--audit-imports: a forged snapshot (one prompt's K/V under another's tokens, every check
    recomputed) is never served and its blocks are removed; a genuine one is served once the model
    has recomputed it in idle time. Answers equal the --no-cache server's throughout."""
    source = closed(settings, admin_key=ADMIN)
    with serve(source, tiny_model) as a:
        Api(a).complete(PROMPT_A)
        Api(a).complete(PROMPT_B)
        Api(a).flush()
        genuine = export_archive(a, [PROMPT_A], ADMIN)
        bad = forged(genuine, export_archive(a, [PROMPT_B], ADMIN), tiny_model.kv_spec)
    target = closed(settings, admin_key=ADMIN, audit_imports=True, key_prefix=settings.key_prefix + "t:")
    target = target.model_copy(update={"blob_dir": tmp_path / "target"})
    expected_a, expected_b = cold.complete(PROMPT_A), cold.complete(PROMPT_B)
    with serve(target, tiny_model) as b:
        cache = b.app.state.engine.cache
        report = import_archive(b, bad, ADMIN).json()
        assert (report["imported"], report["awaiting_audit"], report["rejected"]) == (3, 3, [])
        first = Api(b).complete(PROMPT_B)
        assert first.cached_tokens == 0 and first.key == expected_b.key  # never served unaudited
        wait_for(lambda: cache.admin.stats().imports_rejected == 3)
        assert cache.admin.stats().imports_confirmed == 0
        report = import_archive(b, genuine, ADMIN).json()
        assert (report["imported"], report["awaiting_audit"]) == (3, 3)
        wait_for(lambda: cache.admin.stats().imports_confirmed == 3)
        hit = Api(b).complete(PROMPT_A)
        assert hit.cached_tokens == 3 * BLOCK_SIZE and hit.key == expected_a.key
        again = Api(b).complete(PROMPT_B)
        assert again.key == expected_b.key


def test_a_forged_copy_of_blocks_on_disk_is_never_served(settings, tiny_model, serve, cold, tmp_path) -> None:
    """A forged snapshot of blocks this deployment holds (indexed, or whose entries expired while
    their files remain): the blobs on disk are kept (create-only) and what is served is what they
    hold, never the forged copy (not even from the RAM tier), audited import or not."""
    expected = cold.complete(PROMPT_A)
    for audit in (False, True):
        target = closed(
            settings, admin_key=ADMIN, audit_imports=audit, key_prefix=f"{settings.key_prefix}{audit}:"
        )
        target = target.model_copy(update={"blob_dir": tmp_path / f"blobs-{audit}"})
        with serve(target, tiny_model) as server:
            cache = server.app.state.engine.cache
            Api(server).complete(PROMPT_A)
            Api(server).complete(PROMPT_B)
            Api(server).flush()
            bad = forged(
                export_archive(server, [PROMPT_B], ADMIN),
                export_archive(server, [PROMPT_A], ADMIN),
                tiny_model.kv_spec,
            )
            cache.parts.ram.clear()
            if audit:  # the entries expire, the files stay (not yet collected)
                namespace = tiny_model.namespace("default")
                for block_hash in block_hashes(PROMPT_A, namespace):
                    cache.parts.index.drop(namespace, block_hash)
            report = import_archive(server, bad, ADMIN).json()
            assert report["rejected"] == [], report
            if audit:
                wait_for(
                    lambda c=cache: c.admin.stats().imports_confirmed + c.admin.stats().imports_rejected == 3
                )
            answer = Api(server).complete(PROMPT_A)
            assert answer.key == expected.key, audit


# 3. Imports are read into memory whole.


@pytest.mark.parametrize("where", ["manifest", "block", "size"])
def test_archive_members_are_checked_before_they_are_read(settings, tiny_model, serve, where) -> None:
    """A manifest or block member declaring more than it may hold (here 10**13 bytes, with no
    data behind it), or a block whose size differs from the manifest's, is a 400 naming the
    member; nothing is stored."""
    with serve(settings, tiny_model) as server:
        Api(server).complete(PROMPT_A)
        Api(server).flush()
        archive = export_archive(server, [PROMPT_A])
        files = members(archive)
        manifest = json.loads(files[MANIFEST])
        victim = f"blocks/{manifest['blocks'][0]['hash']}.safetensors"
        # NOTE: the member declaring too much comes last: a tar reader finds no header after it
        last = MANIFEST if where == "manifest" else victim
        order = [n for n in files if n != last] + [last]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name in order:
                data = files[name]
                info = tarfile.TarInfo(name)
                info.size = len(data)
                if name == victim and where == "size":
                    data = data + b"\0"
                    info.size = len(data)
                huge = (where == "manifest" and name == MANIFEST) or (where == "block" and name == victim)
                if huge:
                    info.size = 10**13
                    tar.fileobj.write(info.tobuf(tar.format, tar.encoding, tar.errors))
                    continue  # NOTE: the header alone: the declared bytes never follow
                tar.addfile(info, io.BytesIO(data))
        server.app.state.engine.cache.admin.clear()
        r = import_archive(server, out.getvalue())
        named = MANIFEST if where == "manifest" else victim
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
        assert server.app.state.cache.usage()[0] == 0


def test_malformed_headers_and_duplicates_are_clear(settings, tiny_model, serve) -> None:
    """A PAX sparse header tarfile cannot parse is a 400 (never a 500); a block listed twice in
    the manifest is imported once, the repeat rejected with the reason."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("blocks/x.safetensors")
        info.size, info.pax_headers = 4, {"GNU.sparse.map": "a,b", "GNU.sparse.size": "10"}
        tar.addfile(info, io.BytesIO(b"abcd"))
    with serve(settings, tiny_model) as server:
        r = import_archive(server, buffer.getvalue())
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_snapshot", r.text
        Api(server).complete(PROMPT_A)
        Api(server).flush()
        files = members(export_archive(server, [PROMPT_A]))
        manifest = json.loads(files[MANIFEST])
        manifest["blocks"] = manifest["blocks"] + manifest["blocks"][:1]
        server.app.state.engine.cache.admin.clear()
        report = import_archive(server, pack(files | {MANIFEST: json.dumps(manifest).encode()})).json()
    assert report["imported"] == 3 and [r["reason"] for r in report["rejected"]] == [
        "it is listed twice in the manifest"
    ]


def test_an_archive_over_the_import_limit_is_refused(settings, tiny_model, serve) -> None:
    """--max-import-bytes bounds the upload: 413 before the archive is opened."""
    with serve(settings.model_copy(update={"max_import_bytes": 1000}), tiny_model) as server:
        r = import_archive(server, b"\0" * 5000)
    assert r.status_code == 413 and "--max-import-bytes" in r.json()["error"]["message"]


# 4. Prompt text leaks.


def test_prompt_text_is_never_shown_to_an_anonymous_client_of_a_keyed_server(
    settings, tiny_model, serve
) -> None:
    """With an admin key and no API keys, /stats shows hot prefixes' text to the admin key only."""
    text = "The quick brown fox " * 60
    with serve(closed(settings, admin_key=ADMIN), tiny_model) as server:
        for _ in range(2):
            httpx.post(
                f"{server.base_url}/v1/completions",
                json={"model": "tiny", "prompt": text, "max_tokens": 1},
                timeout=120,
            )
        assert server.app.state.engine.cache.flush(HANG_S)
        anonymous = httpx.get(f"{server.base_url}/stats").json()["hot_prefixes"]
        admin = httpx.get(f"{server.base_url}/stats", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert anonymous and all(row["text"] is None for row in anonymous)
    assert admin["hot_prefixes"][0]["text"] and "quick brown fox" in admin["hot_prefixes"][0]["text"]


def test_an_explanation_shows_no_cached_text_to_an_anonymous_client_of_a_keyed_server(
    settings, tiny_model, serve
) -> None:
    """x-kvproxy-explain names where a prompt diverges from a cached one; the cached side's text
    only for a caller who may read it (here the admin key, not a client without one)."""
    first, second = "The secret password is swordfish. " * 40, "The secret password is swordfish. " * 20
    with serve(closed(settings, admin_key=ADMIN), tiny_model) as server:
        url = f"{server.base_url}/v1/completions"
        httpx.post(url, json={"model": "tiny", "prompt": first, "max_tokens": 1}, timeout=60)
        assert server.app.state.engine.cache.flush(HANG_S)
        views = []
        for question, headers in (
            ("What is it?", {}),
            ("Tell me again.", {"Authorization": f"Bearer {ADMIN}"}),
        ):
            probe = {"model": "tiny", "prompt": second + question * 40, "max_tokens": 1}
            r = httpx.post(url, json=probe, headers={"x-kvproxy-explain": "1"} | headers, timeout=60)
            views.append(r.json()["kvproxy_cache_explanation"]["divergence"])
    anonymous, admin = views
    assert anonymous is not None and anonymous["cached"] is None and anonymous["token_position"] > 0
    assert admin is not None and admin["cached"]  # the text of whichever cached sibling it met


# 8. Counted as imported, then deleted.


def test_a_block_whose_parent_is_nowhere_is_rejected(settings, tiny_model, serve, tmp_path) -> None:
    """A snapshot holding blocks 1 and 2 of a chain but not block 0, into a deployment that does
    not cache it: both are rejected with the reason, none reported imported."""
    with serve(settings, tiny_model) as a:
        Api(a).complete(PROMPT_A)
        Api(a).flush()
        files = members(export_archive(a, [PROMPT_A]))
    manifest = json.loads(files[MANIFEST])
    root = next(b for b in manifest["blocks"] if b["index"] == 0)
    manifest["blocks"] = [b for b in manifest["blocks"] if b["index"] > 0]
    files = {k: v for k, v in files.items() if root["hash"] not in k} | {
        MANIFEST: json.dumps(manifest).encode()
    }
    other = settings.model_copy(update={"key_prefix": settings.key_prefix + "o:", "blob_dir": tmp_path / "o"})
    with serve(other, tiny_model) as b:
        report = import_archive(b, pack(files)).json()
        assert b.app.state.cache.usage()[0] == 0
    assert report["imported"] == 0 and len(report["rejected"]) == 2
    assert "neither in the snapshot nor cached" in report["rejected"][0]["reason"]
    assert "parent block was rejected" in report["rejected"][1]["reason"]


# 7. Secrets in logs.


def test_passwords_in_urls_never_reach_the_output(tmp_path) -> None:
    """A password in --redis-url (also a cluster one, an option in its query) or an upstream URL
    is redacted in every message: start-up logs and command-line errors."""
    model = build_tiny_model(tmp_path / "tiny")
    secret = "hunter2-secret"
    runs = [
        ["cache", "stats", "--redis-url", f"redis://:{secret}@127.0.0.1:1/0"],
        ["cache", "stats", "--redis-url", f"redis+cluster://:{secret}@nohostport"],
        [
            "cache",
            "stats",
            "--redis-url",
            f"redis+sentinel://127.0.0.1:1/mymaster?sentinel_password={secret}&x=1",
        ],
        ["route", "--upstream", f"http://user:{secret}@host:8000/not-v1"],
        ["serve", "--model", str(model), "--blob-url", f"gopher://user:{secret}@x/"],
        ["serve", "--model", str(model), "--blob-url", f"s3://AKIA:{secret}@bucket/prefix"],
        ["serve", "--model", str(model), "--blob-url", f"s3://bucket/prefix?token={secret}"],
        ["cache", "stats", "--redis-url", f"redis://127.0.0.1:1/0?pass%77ord={secret}"],
        ["cache", "import", str(model / "config.json"), "--base-url", f"http://u:{secret}@127.0.0.1:1/v1"],
    ]
    for args in runs:
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0 and secret not in done.stdout + done.stderr, (args, done.stderr)
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            str(free_port()),
            "--cache-dir",
            str(tmp_path),
            "--redis-url",
            f"redis://:{secret}@127.0.0.1:1/0",
            "--redis-timeout",
            "0.1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and not any("Uvicorn running" in line for line in lines):
            lines.append(serve.stderr.readline())
    finally:
        serve.terminate()
        serve.wait(HANG_S)
    output = "".join(lines)
    assert "is unreachable" in output and "redis://:***@127.0.0.1:1/0" in output and secret not in output


# 9. Repeated flags silently dropped.


def test_a_repeated_flag_adds_to_a_list_or_is_refused() -> None:
    """--upstream twice routes to both (the router's own flags, parsed as `kvproxy route` parses
    them); any other flag given twice is a usage error of the real command."""

    @click.command()
    @route_options
    def probe(**flags: object) -> None:
        click.echo(parse_settings(RouteSettings, flags).upstreams)

    result = CliRunner().invoke(probe, ["--upstream", "http://a:1/v1", "--upstream", "http://b:2/v1"])
    assert result.output.strip() == "['http://a:1/v1', 'http://b:2/v1']", result.output
    for args in (
        ["serve", "--port", "1", "--port", "2"],
        ["cache", "stats", "--key-prefix", "a:", "--key-prefix", "b:"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and "given 2 times" in done.stderr, done.stderr
