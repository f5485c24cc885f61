"""A small client for tests that compare a cached server with a cold (--no-cache) one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.helpers import HANG_S, ServerThread, wait_for


@dataclass
class Result:
    """What a completion came back as; ``key`` is what "identical" compares."""

    status: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    first_logprobs: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[list[int], str | None]:
        return self.token_ids, self.finish_reason


class Api:
    """``/v1/completions`` with token-id prompts against one test server."""

    def __init__(self, server: ServerThread, model: str = "tiny") -> None:
        self.server, self.model = server, model

    @property
    def engine(self) -> Any:
        return self.server.app.state.engine

    @property
    def cache(self) -> Any:
        return self.server.app.state.engine.cache

    def flush(self) -> None:
        """Wait until background saves are on disk and in the index."""
        if self.cache is not None:
            assert self.cache.flush(HANG_S)

    def complete(
        self, prompt: list[int] | tuple[int, ...], max_tokens: int = 8, stream: bool = False, **extra: Any
    ) -> Result:
        body = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 5,
            "return_token_ids": True,
            "stream": stream,
            "stream_options": {"include_usage": True} if stream else None,
        } | extra
        url = f"{self.server.base_url}/v1/completions"
        if not stream:
            r = httpx.post(url, json=body, timeout=300)
            if r.status_code != 200:
                return Result(r.status_code)
            doc = r.json()
            return _result(200, doc["choices"], doc["usage"])
        choices, usage = [], None
        with httpx.stream("POST", url, json=body, timeout=300) as r:
            if r.status_code != 200:
                return Result(r.status_code)
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    doc = json.loads(line.removeprefix("data: "))
                    choices += doc["choices"]
                    usage = doc.get("usage") or usage
        assert usage is not None
        return _result(200, choices, usage)


def _result(status: int, choices: list[dict[str, Any]], usage: dict[str, Any]) -> Result:
    result = Result(status, prompt_tokens=usage["prompt_tokens"])
    result.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
    for choice in choices:
        result.token_ids += choice.get("token_ids", [])
        result.text += choice["text"]
        result.finish_reason = choice["finish_reason"] or result.finish_reason
        logprobs = choice.get("logprobs")
        if logprobs and logprobs["top_logprobs"] and not result.first_logprobs:
            result.first_logprobs = logprobs["top_logprobs"][0]
    return result


def audited(server, key: str | None = None) -> dict:
    """The audit's figures (as ``key`` sees them) once every sampled hit has been audited."""
    engine = server.app.state.engine
    wait_for(lambda: not engine.audits_pending and engine.idle, what="the audit to catch up")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.base_url}/stats", headers=headers, timeout=60).json()["audit"]
