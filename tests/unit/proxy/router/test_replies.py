"""proxy/router/replies.py on Gemini's answers: the reply's text (whole, and streamed chunk by
chunk) and its ``usageMetadata`` as the router counts usage."""

from __future__ import annotations

from proxy.router.replies import delta_text, reply_text, reply_usage, response_id


def answer(text: str, prompt: int = 300, cached: int = 256) -> dict[str, object]:
    """A ``GenerateContentResponse`` as ``kvproxy serve`` writes one (a stream's chunks too)."""
    return {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
        "usageMetadata": {"promptTokenCount": prompt, "cachedContentTokenCount": cached},
        "responseId": "gen-1",
    }


def test_a_gemini_answer_gives_its_text_and_usage() -> None:
    """Candidate 0's text parts, whole or a chunk's; the prompt and cached counts as chat usage."""
    assert reply_text("gemini", answer("Paris")) == "Paris"
    assert "".join(delta_text("gemini", answer(t)) for t in ("Pa", "ris")) == "Paris"
    usage = reply_usage("gemini", answer("x", prompt=300, cached=256))
    assert usage == {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}
    assert response_id(answer("x")) is None


def test_what_is_not_an_answer_gives_nothing() -> None:
    """No candidate, an error event, a named cache's description: no text, no usage."""
    assert reply_text("gemini", {"error": {"code": 500}}) is None
    assert delta_text("gemini", {"candidates": [{"content": "odd"}]}) == ""
    assert reply_usage("gemini", {"error": {"code": 500}}) is None
    described = {"name": "cachedContents/a", "usageMetadata": {"totalTokenCount": 400}}
    assert (
        reply_text("cached_contents", described) is None and reply_usage("cached_contents", described) is None
    )
