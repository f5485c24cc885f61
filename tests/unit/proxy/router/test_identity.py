"""proxy/router/identity.py and hashing/route.py: what the router hashes, without a tokenizer.

Text hashing: the prompt's canonical JSON in 512-byte blocks, so the next turn (this turn plus the
reply) starts with this turn's blocks; the route namespace separates tenants, models and kinds of
hashing, and never meets a K/V namespace."""

from __future__ import annotations

from hashing import BLOCK_SIZE, TEXT_BLOCK_BYTES, NamespaceIdentity, block_hashes, route_namespace
from proxy.router.identity import Identity

SYSTEM = {"role": "system", "content": "You are terse. " * 200}  # about 3,000 bytes: several blocks


def chat(*messages: dict[str, str], **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": list(messages), **extra}


def test_text_blocks_of_a_turn_start_the_next_turn() -> None:
    """Turn 2's key starts with the hashes turn 1 predicted it would (prompt + reply)."""
    identity = Identity(None)
    turn1 = chat(SYSTEM, {"role": "user", "content": "hi"})
    key1 = identity.prompt("chat", turn1, "t")
    predicted = identity.reply_hashes("chat", turn1, key1, "hello")
    turn2 = chat(SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
    key2 = identity.prompt("chat", turn2, "t")
    assert key1.block_size == TEXT_BLOCK_BYTES and len(key1.hashes) >= 5
    assert key2.hashes[: len(predicted)] == predicted and len(predicted) >= len(key1.hashes)
    assert key1.prompt_tokens == len(key1.units) // 4 and key1.tokens_per_block == BLOCK_SIZE


def test_key_order_and_whitespace_do_not_matter_but_tools_do() -> None:
    """Canonical JSON: the same message in another key order hashes alike; tools change the text."""
    identity = Identity(None)
    a = identity.prompt("chat", chat({"role": "user", "content": "x" * 600}), "t")
    b = identity.prompt("chat", {"messages": [{"content": "x" * 600, "role": "user"}], "model": "m"}, "t")
    tools = [{"type": "function", "function": {"name": "f"}}]
    c = identity.prompt("chat", chat({"role": "user", "content": "x" * 600}, tools=tools), "t")
    assert a.hashes == b.hashes and a.hashes[0] != c.hashes[0]


def test_token_id_prompts_are_used_as_they_are() -> None:
    """A completions prompt of token ids is hashed as ids in 128-token blocks."""
    key = Identity(None).prompt("completions", {"model": "m", "prompt": list(range(300))}, "t")
    ns = route_namespace(model="m", tokenizer="ids", tenant="t", block_size=BLOCK_SIZE)
    assert key.hashes == block_hashes(list(range(300)), ns) and key.prompt_tokens == 300


def test_route_namespaces_separate_tenants_models_and_hashing() -> None:
    """Every field of the route namespace matters, and no route namespace equals a K/V one."""
    base = {"model": "m", "tokenizer": "text", "tenant": "t", "block_size": 512}
    spaces = {route_namespace(**base)}
    for name, value in (("model", "n"), ("tokenizer", "ids"), ("tenant", "u"), ("block_size", 128)):
        spaces.add(route_namespace(**(base | {name: value})))
    assert len(spaces) == 5
    kv = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t").digest()
    assert kv not in spaces


def test_the_router_renders_no_template_from_a_request(tiny_model) -> None:
    """A body's ``chat_template_kwargs`` cannot hand the router a template: the key of a chat with
    a hostile template is the key of the same chat without it (what the replica renders)."""
    identity = Identity(tiny_model.tokenizer, "fp")
    body = chat({"role": "user", "content": "x" * 300})
    bomb = "{% for a in range(9999) %}{% for b in range(9999) %}{{ a }}{% endfor %}{% endfor %}"
    hostile = identity.prompt("chat", body | {"chat_template_kwargs": {"chat_template": bomb}}, "t")
    assert hostile.hashes == identity.prompt("chat", body, "t").hashes and hostile.block_size == BLOCK_SIZE


def test_a_chat_with_tools_hashes_as_the_replica_renders_it(tiny_model) -> None:
    """Tools, calls and results in the history: the router's token ids are the replica's
    (``proxy.serving.prompts.render_turn``), so tool-using agents are routed to their prefix."""
    from proxy.config import Settings
    from proxy.openai.protocol import ChatCompletionRequest
    from proxy.openai.turns import chat_answer, chat_turn
    from proxy.serving.prompts import render_turn

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = chat(
        {"role": "user", "content": "x" * 300},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        tools=tools,
    )
    request = ChatCompletionRequest.model_validate(body)

    turn = chat_turn(request, Settings(), "t", chat_answer(request))
    replica = render_turn(tiny_model.tokenizer, tiny_model.model.config.vocab_size, turn).ids
    key = Identity(tiny_model.tokenizer, "fp").prompt("chat", body, "t")
    assert list(key.units) == replica and key.block_size == BLOCK_SIZE


def gemini_body(*texts: str, system: str | None = None, **extra: object) -> dict[str, object]:
    """A Gemini body: a user content per text (as the SDK writes it), its system instruction."""
    contents = [{"role": "user", "parts": [{"text": t}]} for t in texts]
    return (
        {"contents": contents}
        | ({"systemInstruction": {"parts": [{"text": system}]}} if system else {})
        | extra
    )


def test_a_gemini_body_hashes_as_the_same_chat() -> None:
    """Gemini's contents and system instruction are the chat the replica renders: as text, its
    key is the chat's; the model comes from the path (given), not the body."""
    identity = Identity(None)
    body = gemini_body("x" * 600, system="be brief")
    as_chat = chat({"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 600})
    assert identity.prompt("gemini", body, "t", "m").hashes == identity.prompt("chat", as_chat, "t").hashes
    assert (
        identity.prompt("gemini", body, "t", "other").hashes != identity.prompt("chat", as_chat, "t").hashes
    )


def test_a_named_caches_content_starts_the_prompts_that_follow_it(tiny_model) -> None:
    """With the tokenizer, a ``cachedContents`` body's ids are the content as the replica pins it
    (no generation prompt), the start of a prompt that brings it followed by a question."""
    identity = Identity(tiny_model.tokenizer, "fp")
    content = identity.prompt(
        "cached_contents", gemini_body("x " * 400, system="doc", model="models/m"), "t", "m"
    )
    follow = identity.prompt("gemini", gemini_body("x " * 400, "why?", system="doc"), "t", "m")
    assert len(content.hashes) >= 2 and follow.hashes[: len(content.hashes)] == content.hashes
    assert follow.units[: len(content.units)] == content.units
