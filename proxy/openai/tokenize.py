"""The vLLM server's extra routes that apps and gateways call: ``POST /tokenize``,
``POST /detokenize`` and ``GET /version``.

Source: vLLM's OpenAI-compatible server (``TokenizeRequest``: ``messages`` or ``prompt``,
``add_special_tokens``, ``add_generation_prompt``; the answer's ``tokens``, ``count``,
``max_model_len``). A chat body is rendered exactly as ``/v1/chat/completions`` renders it, so
``count`` is that route's ``prompt_tokens``.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import Field, StrictBool, StrictInt
from starlette.concurrency import run_in_threadpool

from proxy.http.auth import get_tenant
from proxy.http.errors import OpenAIError
from proxy.named.field import refuse_cached_content
from proxy.openai.protocol import ChatMessage, _Lenient
from proxy.openai.turns import messages_prompt_ids
from proxy.serving.facts import served_model
from proxy.serving.prompts import check_token_ids
from proxy.serving.validation import check_model
from proxy.state import EngineDep

router = APIRouter()


class TokenizeRequest(_Lenient):
    model: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt: str | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = Field(None, description="OpenAI function tools, rendered as chat renders them.")


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[StrictInt] = Field(min_length=0)


@router.post("/tokenize", dependencies=[Depends(get_tenant)])
async def tokenize(body: TokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    """Token ids of a chat (rendered with the chat template) or of a prompt string."""
    refuse_cached_content(body)
    tokenizer, facts = served_model(engine)
    if body.model is not None:
        check_model(facts, body.model)
    if (body.messages is None) == (body.prompt is None):
        raise OpenAIError(400, "send exactly one of `messages` and `prompt`", param="messages")
    if body.messages is not None:
        ids = await run_in_threadpool(
            messages_prompt_ids,
            tokenizer,
            facts.vocab_size,
            body.messages,
            body.add_generation_prompt,
            body.chat_template_kwargs,
            body.tools,
        )
    else:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = (await run_in_threadpool(tokenizer, body.prompt, add_special_tokens=add_special))["input_ids"]
    return {"tokens": ids, "count": len(ids), "max_model_len": facts.context_length}


@router.post("/detokenize", dependencies=[Depends(get_tenant)])
async def detokenize(body: DetokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    """The text of token ids."""
    tokenizer, facts = served_model(engine)
    if body.model is not None:
        check_model(facts, body.model)
    check_token_ids(facts.vocab_size, body.tokens, "tokens")
    return {"prompt": tokenizer.decode(body.tokens)}


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": metadata.version("kvproxy")}
