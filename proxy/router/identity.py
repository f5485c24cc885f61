"""What the router hashes for a request: the prompt's units (token ids, or bytes of its canonical
text) under a route namespace (``hashing.route``), and the same for prompt + reply, so that the
next turn of a conversation finds the replica that answered this one.

Chats come in four dialects: chat completions, the Responses API (its instructions and input
items as ``proxy.responses`` turns them into a chat), Anthropic's Messages API (as
``proxy.anthropic`` does) and Gemini's contents (as ``proxy.gemini`` does; a named cache's
content is a chat too, without the generation prompt). With a tokenizer, a chat is rendered
exactly as ``kvproxy serve`` renders it (``proxy.tools.rendering.render_chat``, tools as
``proxy.tools.prompt`` writes them and ``chat_template_kwargs`` included) and a completion's
string prompt tokenized as the engine does; token-id prompts are used as they are. Without one,
each message is written as canonical JSON (sorted keys, no spaces), one per line, after a line
holding the fields that change the rendering (tools, template arguments); turn N + 1's text then
starts with turn N's text plus its reply. A wrong guess only costs a miss: answers always come
from the upstream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hashing import (
    BLOCK_SIZE,
    BYTES_PER_TOKEN,
    TEXT_BLOCK_BYTES,
    BlockHash,
    Namespace,
    block_hashes,
    route_namespace,
)
from proxy.anthropic.protocol import MessagesRequest
from proxy.anthropic.turns import messages_turn
from proxy.gemini.protocol import CachedContentRequest, GenerateContentRequest
from proxy.gemini.protocol import chat_messages as gemini_messages
from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatCompletionRequest
from proxy.openai.tools import chat_tools
from proxy.responses.history import chat_messages
from proxy.responses.items import input_items
from proxy.responses.protocol import ResponsesRequest
from proxy.router.policy import Endpoint
from proxy.serving.metadata import chat_without_metadata
from proxy.tools.formats import tool_format
from proxy.tools.prompt import tool_messages
from proxy.tools.rendering import RenderError, TemplateMessage, render_chat
from proxy.tools.spec import ToolSet

Chat = tuple[list[TemplateMessage], ToolSet | None]
"""A chat as its template takes it: the messages, and the tools (``proxy.tools.prompt``)."""


@dataclass(frozen=True)
class PromptKey:
    """A request's identity for routing.

    Attributes:
        namespace: the route namespace (``hashing.route_namespace``).
        hashes: chained hashes of the prompt's full blocks.
        prompt_tokens: the prompt's length in tokens (estimated as bytes / ``BYTES_PER_TOKEN``
            when hashing text).
        units: the prompt's units (token ids, or bytes of its text).
        block_size: units per block.
        tokens_per_block: 128 (``BLOCK_SIZE``) either way: a text block is about that many tokens.
    """

    namespace: Namespace
    hashes: list[BlockHash]
    prompt_tokens: int
    units: tuple[int, ...]
    block_size: int
    tokens_per_block: int = BLOCK_SIZE

    def extended(self, more: list[int]) -> list[BlockHash]:
        """Hashes of the prompt followed by ``more`` units (the reply)."""
        return block_hashes([*self.units, *more], self.namespace, self.block_size)


class Identity:
    """Turns request bodies into ``PromptKey``s.

    Args:
        tokenizer: a transformers tokenizer with the replicas' chat template, or None (text).
        fingerprint: the tokenizer's fingerprint (part of the namespace).
    """

    def __init__(self, tokenizer: Any | None, fingerprint: str = "text") -> None:
        self.tokenizer: Any = tokenizer
        self.fingerprint = fingerprint

    def prompt(
        self, kind: Endpoint, body: dict[str, Any], tenant: str, model: str | None = None
    ) -> PromptKey:
        """The key of a body (already parsed JSON) sent to ``kind``'s route, for ``model`` (by
        default the body's; Gemini's routes name it in the path). A named cache's content
        (``cached_contents``) is rendered as the replica stores it, without a generation prompt:
        the start of every prompt that follows it."""
        model = str(body.get("model", "")) if model is None else model
        if kind == "completions" and _is_ids(body.get("prompt")):
            return self._key(
                model, tenant, "ids" if self.tokenizer is None else self.fingerprint, body["prompt"]
            )
        chat = None if kind == "completions" else _chat(kind, body)
        if self.tokenizer is not None:
            ids = self._token_ids(body, chat, add_generation_prompt=kind != "cached_contents")
            if ids is not None:
                return self._key(model, tenant, self.fingerprint, ids)
        text = _prompt_text(body.get("prompt")) if kind == "completions" else _chat_text(body, chat)
        return self._key(model, tenant, "text", list(text.encode()))

    def reply_hashes(
        self, kind: Endpoint, body: dict[str, Any], key: PromptKey, reply: str
    ) -> list[BlockHash]:
        """Hashes of the prompt followed by the reply, as the next turn will start."""
        answer = {"role": "assistant", "content": reply}
        if key.block_size == TEXT_BLOCK_BYTES:
            tail = reply if kind == "completions" else _message_line(answer)
            return key.extended(list(tail.encode()))
        if self.tokenizer is None:
            return key.hashes  # token-id prompts without a tokenizer: the reply cannot be tokenized
        if kind == "completions":
            return key.extended(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
        chat = _chat(kind, body)
        if chat is None:
            return key.hashes
        messages, tools = chat
        rendered = self._token_ids(body, ([*messages, answer], tools), add_generation_prompt=False)
        return key.hashes if rendered is None else block_hashes(rendered, key.namespace, key.block_size)

    def _token_ids(
        self, body: dict[str, Any], chat: Chat | None, add_generation_prompt: bool = True
    ) -> list[int] | None:
        """The prompt's ids as the replica renders it (a completion's ``prompt`` when ``chat`` is
        None); None when it cannot be rendered that way."""
        try:
            if chat is None:
                return list(self.tokenizer(_prompt_text(body.get("prompt")))["input_ids"])
            messages, template_tools = tool_messages(chat[0], chat[1], tool_format(self.tokenizer))
            return render_chat(
                self.tokenizer,
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=template_tools,
                template_kwargs=body.get("chat_template_kwargs"),
            )
        except (RenderError, OpenAIError, ValueError, TypeError):
            return None  # the router cannot render it the engine's way: hash the text instead

    def _key(self, model: str, tenant: str, tokenizer: str, units: list[int]) -> PromptKey:
        text = tokenizer == "text"
        size = TEXT_BLOCK_BYTES if text else BLOCK_SIZE
        namespace = route_namespace(model=model, tokenizer=tokenizer, tenant=tenant, block_size=size)
        tokens = len(units) // BYTES_PER_TOKEN if text else len(units)
        return PromptKey(namespace, block_hashes(units, namespace, size), tokens, tuple(units), size)


def _is_ids(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) and t >= 0 for t in prompt)


def _prompt_text(prompt: object) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, separators=(",", ":"))


def _chat(kind: Endpoint, body: dict[str, Any]) -> Chat | None:
    """A ``chat``, ``responses``, ``messages`` or Gemini body as the chat its replica renders
    (None when the body is not one the replica would serve)."""
    try:
        if kind in ("gemini", "cached_contents"):
            gemini = (GenerateContentRequest if kind == "gemini" else CachedContentRequest).model_validate(
                body
            )
            return gemini_messages(gemini.system_instruction, gemini.contents), None
        if kind == "messages":
            turn = messages_turn(MessagesRequest.model_validate(body), "")
            return turn.messages or [], turn.tools
        if kind == "responses":
            responses = ResponsesRequest.model_validate(body)
            chat = responses.chat_request(
                responses.system_messages() + chat_messages(input_items(responses.input))
            )
        else:
            chat = ChatCompletionRequest.model_validate(body)
        # NOTE: without the client metadata a replica leaves out by default (proxy.serving.metadata)
        return chat_without_metadata(chat.template_messages())[0], chat_tools(chat) if chat.tools else None
    except (OpenAIError, ValueError, TypeError):
        return None


def _chat_text(body: dict[str, Any], chat: Chat | None) -> str:
    """The chat as text: a line of the fields that change the rendering, then one line per
    message (the body's own messages when it cannot be read as a chat)."""
    header = {k: body.get(k) for k in ("tools", "chat_template_kwargs", "functions") if body.get(k)}
    lines = [json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"]
    messages = chat[0] if chat is not None else body.get("messages") or []
    return "".join(lines + [_message_line(m) for m in messages])


def _message_line(message: object) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
