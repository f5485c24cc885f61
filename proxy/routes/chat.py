"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from jinja2 import TemplateError

from engine.worker import Engine
from proxy.errors import OpenAIError
from proxy.protocol import ChatCompletionRequest
from proxy.serving import check_model, complete, generation_request, new_id, now, sse_stream, submit
from proxy.state import get_engine

router = APIRouter()


def render_prompt(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    """The chat template rendered with the generation prompt, as token ids.

    NOTE: the template already writes every special token it wants (BOS, role markers), so the
    tokenizer must not add its own (``add_special_tokens=False``): no doubled BOS.
    """
    tokenizer = engine.loaded.tokenizer
    if not tokenizer.chat_template:
        raise OpenAIError(400, "this model has no chat template; use /v1/completions", param="messages")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError as exc:
        raise OpenAIError(400, f"the chat template rejected the messages: {exc}", param="messages") from exc
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, engine: Annotated[Engine, Depends(get_engine)]
) -> Any:
    check_model(engine, body.model)
    prompt_ids = render_prompt(engine, body)
    max_tokens = body.max_completion_tokens or body.max_tokens
    handle = submit(engine, generation_request(engine, body, prompt_ids, max_tokens))
    completion_id, created = new_id("chatcmpl"), now()

    if body.stream:
        sent_role = False

        def chunk(text: str | None, finish_reason: str | None) -> dict[str, Any]:
            nonlocal sent_role
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if not sent_role:
                delta["role"], sent_role = "assistant", True
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": engine.loaded.name,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }

        return StreamingResponse(
            sse_stream(handle, chunk, body.include_usage), media_type="text/event-stream"
        )

    result = await complete(handle)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": engine.loaded.name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": result.usage,
    }
