"""``POST /v1/completions``: prompt as a string or a list of token ids."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from engine.worker import Engine
from proxy.errors import OpenAIError
from proxy.protocol import CompletionRequest
from proxy.serving import check_model, complete, generation_request, new_id, now, sse_stream, submit
from proxy.state import get_engine

router = APIRouter()


def prompt_ids(engine: Engine, body: CompletionRequest) -> list[int]:
    """Token ids of the prompt: a string is tokenized as is (with the tokenizer's own special
    tokens); a list of ids is checked against the vocabulary.

    Raises:
        OpenAIError: a token id outside ``[0, vocab_size)`` (400).
    """
    if isinstance(body.prompt, str):
        return engine.loaded.tokenizer(body.prompt)["input_ids"]
    vocab = engine.loaded.model.config.vocab_size
    bad = next((t for t in body.prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
    return list(body.prompt)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, engine: Annotated[Engine, Depends(get_engine)]) -> Any:
    check_model(engine, body.model)
    handle = submit(engine, generation_request(engine, body, prompt_ids(engine, body), body.max_tokens))
    completion_id, created = new_id("cmpl"), now()

    def chunk(text: str | None, finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": engine.loaded.name,
            "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}],
        }

    if body.stream:
        return StreamingResponse(
            sse_stream(handle, chunk, body.include_usage), media_type="text/event-stream"
        )
    result = await complete(handle)
    return chunk(result.text, result.finish_reason) | {"usage": result.usage}
