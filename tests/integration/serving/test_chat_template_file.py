"""``--chat-template FILE``: a model without a chat template (as a GGUF file may be) serves chats in
every dialect once a template file is given, rendered by that file; a missing or broken file stops
the start, naming it (tiny model, real HTTP)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from engine.model.loading import LoadedModel
from proxy.cli import main
from proxy.config import Settings

# NOTE: not ChatML: the prompt it renders differs from the tiny model's own template
BRACKETS = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture
def no_template(tiny_model: LoadedModel) -> LoadedModel:
    """The tiny model with no chat template at all."""
    tokenizer = copy.copy(tiny_model.tokenizer)
    tokenizer.chat_template = None
    return dataclasses.replace(tiny_model, tokenizer=tokenizer)


@pytest.fixture
def template_file(tmp_path: Path) -> Path:
    path = tmp_path / "brackets.jinja"
    path.write_text(BRACKETS)
    return path


def rendered(model: LoadedModel, *turns: tuple[str, str]) -> list[int]:
    """The ids BRACKETS renders for ``turns`` (role, text) and the generation prompt."""
    tok = model.tokenizer
    text = "".join(f"[{role}] {content}{tok.eos_token}" for role, content in turns)
    return list(tok(f"{tok.bos_token}{text}[assistant] ", add_special_tokens=False)["input_ids"])


def post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=60)


def test_without_a_template_every_chat_route_refuses(settings, no_template, serve) -> None:
    """No template, no setting: a chat is a 400 naming the missing template, in each dialect."""
    with serve(settings, no_template) as server:
        chat = post(server.base_url, "/v1/chat/completions", chat_body())
        anthropic = post(server.base_url, "/v1/messages", messages_body())
    assert chat.status_code == anthropic.status_code == 400
    assert "no chat template" in chat.json()["error"]["message"]
    assert "no chat template" in anthropic.json()["error"]["message"]


def chat_body() -> dict:
    return {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "The quick fox"},
        ],
        "max_tokens": 3,
        "temperature": 0,
    }


def messages_body() -> dict:
    return {
        "model": "tiny",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "The quick fox"}],
        "max_tokens": 3,
    }


def test_the_template_file_renders_every_dialect(settings, no_template, template_file, serve) -> None:
    """With --chat-template, chat completions, Messages, Responses and /tokenize render the chat
    with the file: the same prompt, token for token, as the template renders it."""
    expected = rendered(no_template, ("system", "Be brief."), ("user", "The quick fox"))
    with serve(settings.model_copy(update={"chat_template": template_file}), no_template) as server:
        chat = post(server.base_url, "/v1/chat/completions", chat_body())
        anthropic = post(server.base_url, "/v1/messages", messages_body())
        responses = post(
            server.base_url,
            "/v1/responses",
            {"model": "tiny", "instructions": "Be brief.", "input": "The quick fox", "max_output_tokens": 16},
        )
        ids = post(server.base_url, "/tokenize", {"model": "tiny", "messages": chat_body()["messages"]})
    assert chat.status_code == anthropic.status_code == responses.status_code == ids.status_code == 200
    assert ids.json()["tokens"] == expected
    assert chat.json()["usage"]["prompt_tokens"] == len(expected)
    usage = anthropic.json()["usage"]  # NOTE: Anthropic counts cached tokens apart
    assert sum(
        usage[k] or 0 for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ) == len(expected)
    assert responses.json()["usage"]["input_tokens"] == len(expected)


def test_the_file_replaces_a_template_the_model_has(settings, tiny_model, template_file, serve) -> None:
    """A model with its own template (ChatML) renders with the file instead; the shared model's
    tokenizer keeps its own."""
    own = tiny_model.tokenizer.chat_template
    with serve(settings.model_copy(update={"chat_template": template_file}), tiny_model) as server:
        ids = post(server.base_url, "/tokenize", {"model": "tiny", "messages": chat_body()["messages"]})
    assert ids.json()["tokens"] == rendered(tiny_model, ("system", "Be brief."), ("user", "The quick fox"))
    assert tiny_model.tokenizer.chat_template == own


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "does not exist"),
        ("{% for m in messages %}[{{ m.role }}]", "is not a valid Jinja template"),
        ("  \n", "is empty"),
    ],
)
def test_a_missing_or_broken_file_stops_the_start(tmp_path: Path, content, error) -> None:
    """``kvproxy serve`` exits before any model loads, naming the flag, the file and the fault;
    the environment variable is checked the same way."""
    path = tmp_path / "template.jinja"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(main, ["serve", "--chat-template", str(path), "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--chat-template" in result.output and str(path) in result.output and error in result.output
    with pytest.raises(ValueError, match=error):
        Settings(_env_file=None, **{"chat_template": path})


def test_the_router_renders_with_the_same_file(tmp_path: Path, template_file: Path) -> None:
    """``kvproxy route --tokenizer DIR --chat-template FILE`` renders prompts as a replica given
    the file does, under a fingerprint of its own (keys of the file's prompts never mix with the
    tokenizer's own)."""
    from proxy.router.app import load_identity
    from proxy.router.settings import RouteSettings
    from tests.helpers import build_tiny_model

    build_tiny_model(tmp_path / "tok")
    plain = RouteSettings(
        upstream="http://127.0.0.1:1/v1", tokenizer=str(tmp_path / "tok"), cache_dir=tmp_path
    )
    own = load_identity(plain)
    given = load_identity(plain.model_copy(update={"chat_template": template_file}))
    assert given.tokenizer.chat_template == BRACKETS != own.tokenizer.chat_template
    assert given.fingerprint != own.fingerprint
