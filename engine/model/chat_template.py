"""Chat templates given apart from a model's tokenizer files: ``--chat-template FILE`` (as vLLM's
and llama.cpp's servers take one) and the templates kvproxy ships for known models whose GGUF file
carries none (``engine/model/templates/*.jinja``, package data).

A template is Jinja text as transformers renders it (``apply_chat_template``): the variables
``messages``, ``add_generation_prompt``, ``tools``, the special tokens (``bos_token``, ...) and
``raise_exception``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.model.errors import ModelError


def read_chat_template(path: Path) -> str:
    """The text of the Jinja chat template file at ``path``, checked to parse.

    Raises:
        ModelError: the file does not exist, cannot be read as UTF-8 text, is empty, or is not a
            valid Jinja template (the message names the line).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"chat template {path} does not exist") from None
    except IsADirectoryError:
        raise ModelError(f"chat template {path} is a directory, not a Jinja file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read chat template {path}: {exc}") from None
    check_chat_template(text, str(path))
    return text


def check_chat_template(text: str, where: str) -> None:
    """Raises ModelError when ``text`` (from ``where``) is empty or not a Jinja template.

    NOTE: parsed in the environment transformers renders templates in (sandboxed, ``trim_blocks``,
    ``lstrip_blocks``, loop controls), so a template that parses here compiles there.
    """
    if not text.strip():
        raise ModelError(f"chat template {where} is empty")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    try:
        env.parse(text)
    except TemplateSyntaxError as exc:
        raise ModelError(
            f"chat template {where} is not a valid Jinja template: {exc.message} (line {exc.lineno})"
        ) from None


def shipped_chat_template(name: str) -> str:
    """The text of ``engine/model/templates/<name>`` (a template kvproxy ships)."""
    return files("engine.model").joinpath("templates", name).read_text(encoding="utf-8")


def use_chat_template(tokenizer: Any, template: str | None) -> None:
    """Make ``template`` (when given) the chat template every rendering with ``tokenizer`` uses,
    replacing the model's own."""
    if template is not None:
        tokenizer.chat_template = template
