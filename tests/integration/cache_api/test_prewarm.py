"""``POST /v1/cache/prewarm``: a prompt's full blocks are stored without sampling, and the first
request that shares them hits them with the answer a cold server gives."""

from __future__ import annotations

import json

import httpx

from hashing import BLOCK_SIZE
from tests.api import Api
from tests.helpers import random_tokens

SYSTEM = "You answer questions about the kvproxy manual. " + " ".join(
    f"Rule {i}: be brief." for i in range(90)
)


def post(server, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.base_url}/v1/cache/prewarm", json=body, headers=headers, timeout=120)


def chat(server, messages: list[dict], key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_prewarmed_system_prompt_is_hit_by_the_first_chat(settings, tiny_model, serve) -> None:
    """Prewarm [system] without the generation prompt; the first chat with that system prompt
    reports every one of its tokens cached (its blocks, then its tail) and answers as a
    --no-cache server does."""
    system = [{"role": "system", "content": SYSTEM}]
    messages = [*system, {"role": "user", "content": "What is rule 7?"}]
    cold = settings.model_copy(update={"no_cache": True})
    with serve(settings, tiny_model) as server, serve(cold, tiny_model) as reference:
        r = post(server, {"messages": system, "add_generation_prompt": False})
        assert r.status_code == 200, r.text
        shared = r.json()["prompt_tokens"]
        assert shared > 3 * BLOCK_SIZE
        assert r.json() | {"ttl_s": 0} == {
            "object": "cache.prewarm",
            "model": "tiny",
            "prompt_tokens": shared,
            "stored_blocks": shared // BLOCK_SIZE,
            "stored_tokens": shared,
            "cached_blocks": 0,
            "cached_tokens": 0,
            "tail_tokens": shared % BLOCK_SIZE,
            "uncached_tokens": 0,
            "ttl_s": 0,
        }
        stats = server.app.state.engine.stats()
        assert (stats.requests, stats.prompt_tokens) == (0, 0)  # not a request, not in hit rates
        assert stats.prewarm_tokens == shared

        answer, expected = chat(server, messages), chat(reference, messages)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == shared
        assert answer["choices"][0]["message"] == expected["choices"][0]["message"]

        again = post(server, {"messages": system, "add_generation_prompt": False, "ttl": 99})
        assert (again.json()["stored_blocks"], again.json()["stored_tokens"]) == (0, 0)
        assert again.json()["cached_blocks"] == shared // BLOCK_SIZE
        assert again.json()["cached_tokens"] == shared
        assert again.json()["ttl_s"] == 99


def test_prompt_as_text_or_ids_and_a_partial_prefix(settings, tiny_model, serve) -> None:
    """Token ids: full blocks and the tail are stored; a longer prompt stores only its new blocks
    and its own tail; with --no-tails only full blocks."""
    ids = random_tokens(700, seed=31)
    with serve(settings, tiny_model) as server:
        first = post(server, {"prompt": ids[:300]}).json()
        assert (first["stored_blocks"], first["stored_tokens"], first["tail_tokens"]) == (2, 300, 44)
        assert (first["cached_blocks"], first["uncached_tokens"]) == (0, 0)
        second = post(server, {"prompt": ids, "model": "tiny"}).json()
        assert (second["stored_blocks"], second["stored_tokens"], second["tail_tokens"]) == (3, 444, 60)
        assert (second["cached_blocks"], second["cached_tokens"], second["uncached_tokens"]) == (2, 256, 0)
        result = Api(server).complete(ids + random_tokens(20, seed=32))
        assert result.cached_tokens == len(ids)
        text = post(server, {"prompt": "short"}).json()
        assert (text["stored_blocks"], text["cached_blocks"], text["uncached_tokens"]) == (0, 0, 0)
        assert text["stored_tokens"] == text["tail_tokens"] == text["prompt_tokens"]
        empty = post(server, {"prompt": []})
        assert empty.status_code == 200 and (
            empty.json()["prompt_tokens"],
            empty.json()["stored_tokens"],
        ) == (0, 0)
    with serve(settings.model_copy(update={"no_tails": True}), tiny_model) as server:
        blocks_only = post(server, {"prompt": random_tokens(300, seed=33)}).json()
        assert (blocks_only["stored_tokens"], blocks_only["tail_tokens"], blocks_only["uncached_tokens"]) == (
            256,
            0,
            44,
        )


def test_prewarm_uses_the_api_keys_tenant(settings, tiny_model, serve) -> None:
    """A tenant's prewarm is a hit for that tenant only."""
    keyed = settings.model_copy(update={"api_keys": "ka=alpha,kb=beta"})
    ids = random_tokens(400, seed=33)
    with serve(keyed, tiny_model) as server:
        assert post(server, {"prompt": ids}).status_code == 401
        assert post(server, {"prompt": ids}, key="ka").json()["stored_blocks"] == 3
        assert post(server, {"prompt": ids}, key="kb").json()["cached_blocks"] == 0
        assert post(server, {"prompt": ids}, key="ka").json()["cached_blocks"] == 3


def test_bad_prewarm_bodies_are_openai_errors(settings, tiny_model, serve) -> None:
    """Both or neither prompt, a foreign model, a bad token id, an over-long prompt: 4xx naming
    the field; nothing is stored."""
    no_cache = settings.model_copy(update={"no_cache": True})
    with serve(settings, tiny_model) as server, serve(no_cache, tiny_model) as cold:
        cases = [
            ({}, 400, None),
            ({"prompt": [1, 2], "messages": [{"role": "user", "content": "x"}]}, 400, None),
            ({"prompt": [1, 2], "model": "other"}, 404, "model"),
            ({"prompt": [10**9]}, 400, "prompt"),
            ({"prompt": [1] * (tiny_model.context_length + 1)}, 400, "prompt"),
            ({"prompt": [1, 2], "ttl": 0}, 400, None),
        ]
        for body, status, param in cases:
            r = post(server, body)
            assert r.status_code == status, (body, r.text)
            assert "message" in r.json()["error"]
            if param is not None:
                assert r.json()["error"]["param"] == param
        assert server.app.state.cache.usage()[0] == 0
        r = post(cold, {"prompt": [1, 2]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "cache_disabled"


def test_the_prewarm_command_reads_json_lines(settings, tiny_model, serve, tmp_path) -> None:
    """`kvproxy cache prewarm FILE` posts each line, reports totals, and names the bad lines."""
    from click.testing import CliRunner

    from proxy.cli import main

    ids = random_tokens(300, seed=34)
    lines = [
        json.dumps({"prompt": ids}),
        "",
        json.dumps({"messages": [{"role": "system", "content": SYSTEM}], "add_generation_prompt": False}),
        "{not json",
        json.dumps({"prompt": [10**9]}),
    ]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    with serve(settings, tiny_model) as server:
        args = ["cache", "prewarm", str(tmp_path / "prompts.jsonl"), "--base-url", f"{server.base_url}/v1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1
        assert "line 4: not JSON" in result.output and "line 5: token id" in result.output
        totals = json.loads(result.output.strip().splitlines()[-1])
        assert totals["prompts"] == 2 and totals["failed"] == 2 and totals["cached_blocks"] == 0
        assert totals["stored_blocks"] == server.app.state.cache.usage()[0] - 2  # and a tail each
        assert Api(server).complete(ids).cached_tokens == len(ids) - 1


def test_what_chat_refuses_prewarm_refuses(settings, tiny_model, serve, tmp_path) -> None:
    """Image content: 400 naming the part, as chat answers; the command stops at a refused key
    and names a file that is not UTF-8 instead of a traceback."""
    from click.testing import CliRunner

    from proxy.cli import main

    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    keyed = settings.model_copy(update={"api_keys": "ka=alpha"})
    with serve(keyed, tiny_model) as server:
        r = post(server, {"messages": image}, key="ka")
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
        (tmp_path / "two.jsonl").write_text(
            json.dumps({"prompt": [1, 2]}) + "\n" + json.dumps({"prompt": [3]}) + "\n"
        )
        args = ["cache", "prewarm", str(tmp_path / "two.jsonl"), "--base-url", f"{server.base_url}/v1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and result.output.count("API key") == 1
        (tmp_path / "utf16.jsonl").write_bytes("\ufeff{}".encode("utf-16"))
        result = CliRunner().invoke(main, ["cache", "prewarm", str(tmp_path / "utf16.jsonl")])
        assert result.exit_code == 1 and "is not UTF-8 text" in result.output
