"""The Gemma 3 chat template kvproxy ships (``engine/model/templates/gemma3.jinja``), rendered as every
route renders chats (``proxy.tools.rendering.render_chat``) with the tiny tokenizer: Gemma's turn
format, the system prompt leading the first user turn, any order of turns an agent sends, and
tools in kvproxy's generic format (the template has no tool syntax of its own)."""

from __future__ import annotations

import pytest

from engine.model.chat_template import check_chat_template, shipped_chat_template
from proxy.tools.formats import tool_format
from proxy.tools.rendering import render_chat, supports_tools
from tests.helpers import tiny_tokenizer

GEMMA = shipped_chat_template("gemma3.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(GEMMA)


def text(tokenizer, messages, **options) -> str:
    return tokenizer.decode(render_chat(tokenizer, messages, **options))


def test_it_parses_as_transformers_compiles_templates() -> None:
    check_chat_template(GEMMA, "gemma3.jinja")


def test_turns_in_gemmas_format_with_the_system_prompt_in_the_first_user_turn(tokenizer) -> None:
    """<bos>, then ``<start_of_turn>user|model\\n...<end_of_turn>\\n`` per turn (text trimmed, as
    Google's template does), the system text and a blank line leading the first user turn, and
    the generation prompt ``<start_of_turn>model\\n``."""
    messages = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!\n"},
        {"role": "user", "content": [{"type": "text", "text": "More"}, {"type": "text", "text": " please"}]},
    ]
    assert text(tokenizer, messages) == (
        "<|im_start|><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nMore please<end_of_turn>\n<start_of_turn>model\n"
    )


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        # tool results arrive as user turns after a user turn: no alternation is required
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\nb<end_of_turn>\n",
        ),
        # a developer message (Responses API) is a system message; a later one leads the next user turn
        (
            [
                {"role": "developer", "content": "rules"},
                {"role": "user", "content": "a"},
                {"role": "system", "content": "note"},
                {"role": "user", "content": "b"},
            ],
            "<start_of_turn>user\nrules\n\na<end_of_turn>\n<start_of_turn>user\nnote\n\nb<end_of_turn>\n",
        ),
        # a system prompt with no user turn after it becomes a user turn of its own
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}],
            "<start_of_turn>user\ns<end_of_turn>\n<start_of_turn>model\nx<end_of_turn>\n",
        ),
        ([{"role": "system", "content": "s"}], "<start_of_turn>user\ns<end_of_turn>\n"),
    ],
)
def test_any_order_of_turns_renders(tokenizer, messages, expected) -> None:
    assert text(tokenizer, messages, add_generation_prompt=False) == "<|im_start|>" + expected


def test_a_prefilled_answer_is_continued(tokenizer) -> None:
    """An assistant prefill (Anthropic's last assistant message) leaves the model turn open."""
    messages = [{"role": "user", "content": "Name a river."}, {"role": "assistant", "content": "The"}]
    assert text(tokenizer, messages, continue_final_message=True) == (
        "<|im_start|><start_of_turn>user\nName a river.<end_of_turn>\n<start_of_turn>model\nThe"
    )


def test_tools_use_the_generic_format(tokenizer) -> None:
    """The template writes no tool syntax, so kvproxy writes the tools and calls itself."""
    assert not supports_tools(tokenizer)
    assert tool_format(tokenizer).name == "generic"
