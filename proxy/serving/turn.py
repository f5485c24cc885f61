"""One turn of a chat (or a raw completion), as every dialect hands it to the core, and its answer.

A dialect's route translates its body once into a ``Turn``, calls
``proxy.serving.starting.start_turn`` (then ``finish_turn``, or streams ``Begun.started`` with
``Begun.plan.stream()``) and shapes the ``Begun``/``Answer`` it gets back (text or calls, finish
reason, ``Usage``) into its wire format.
Nothing under ``proxy/serving/`` knows a dialect: errors are ``OpenAIError`` naming the fields the
dialect told the turn (``Params``), and the usage is counts, never a wire dict.

How a dialect fills a turn:

- ``messages``: the chat as template messages (``proxy.tools.rendering.TemplateMessage``), before
  any tool definitions go in: the core writes the tools (``proxy.tools.prompt.tool_messages``) and
  renders. ``prompt`` instead: a raw completion prompt (a string, tokenized as is, or token ids,
  checked against the vocabulary).
- ``tools`` (a ``ToolSet``) or ``schema`` (a JSON answer); the dialect refuses both together.
- ``sampling``: the optional fields as the body gave them; ``sampling_params`` (one helper)
  applies the defaults. ``max_tokens`` None means up to the context (``--default-max-tokens``).
- ``ttl``: a ``store.interface.TtlPlan`` (OpenAI: ``cache_ttl(settings, retention)``), and/or
  ``marks``: cache breakpoints, each at the end of a message or of the tool definitions, with a
  TTL. The core renders the chat up to each mark, and the positions become both the TTL plan
  (``proxy.serving.prompts.ttl_plan``, each TTL capped at ``--max-ttl``) and tail boundaries.
- ``prefill``: the text of a final assistant message that the answer continues
  (``continue_final_message``); render-ahead then sees the whole assistant turn.
- ``left_out``: the client metadata (``proxy.serving.metadata``) the dialect left out of the
  system texts, unless ``--keep-client-metadata``.

For Anthropic's Messages API: ``messages`` from the body's ``system`` and turns, its
``cache_control`` breakpoints as ``marks`` (``CacheMark(index, ttl)`` for a message,
``CacheMark(None, ttl)`` for a tool definition's), ``prefill`` from a final assistant turn,
``Params(prompt="messages", tools="tools[{i}].input_schema", schema="output_config.format.schema")``,
``schema`` from ``output_config.format``, and
``call_prefix="toolu_"``; the usage's ``written_tokens`` is ``cache_creation_input_tokens`` and
its ``uncached_tokens`` the ``input_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.serving.metadata import LeftOut
from proxy.tools.rendering import TemplateMessage
from proxy.tools.spec import OpenAITool, ToolSet

if TYPE_CHECKING:
    from store.interface import TtlPlan


@dataclass(frozen=True)
class Sampling:
    """Sampling fields as a body gives them (None: not given; ``sampling_params`` applies the
    defaults). ``logit_bias`` maps token ids, written as JSON object keys (ASCII digits), to the
    value added to their logits."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Mapping[str, float] | None = None


@dataclass(frozen=True)
class CacheMark:
    """A cache breakpoint: the prompt up to the end of message ``message`` (None: of the tool
    definitions) is kept ``ttl_s`` seconds (capped at ``--max-ttl``), and a tail is stored there."""

    message: int | None
    ttl_s: int


@dataclass(frozen=True)
class Params:
    """The fields errors are named under: the prompt (``messages``, ``prompt``, ``contents``), a
    tool's schema (``{i}`` is the tool's index) and the answer's schema."""

    prompt: str = "messages"
    tools: str = "tools[{i}].function.parameters"
    schema: str = "response_format.json_schema.schema"


@dataclass(frozen=True)
class Turn:
    """One request, dialect-free (see the module docstring).

    Attributes:
        model: the model the body names (404 unless served).
        tenant: whose cache namespace (from the API key).
        messages: the chat (template messages), or None for a raw ``prompt``.
        prompt: a completion's prompt (a string or token ids) when ``messages`` is None.
        tools: the tools and tool choice (None: none).
        schema: the JSON Schema the answer follows (None: free text).
        schema_strict: whether ``schema`` is enforced in full or refused (OpenAI's ``strict``);
            else the keywords the grammar cannot enforce are left out of it, with a warning
            (``proxy.tools.grammars.options``).
        sampling: the sampling fields.
        max_tokens: most tokens to generate (None: up to the context, bounded by
            ``--default-max-tokens`` unless ``to_window``).
        to_window: a turn without ``max_tokens`` may fill the context, whatever
            ``--default-max-tokens`` says (the Responses API: the hosted API ends such an answer
            only at the model's limits, and Codex fails a turn that ends ``incomplete``).
        stop: strings that end the answer.
        ttl: the blocks' TTL plan (before ``marks``; None: the server's ``--ttl``).
        marks: cache breakpoints (their TTL plan replaces ``ttl`` when there are any).
        top_logprobs: alternatives reported per token.
        template_kwargs: a request's data for the chat template (``template_data`` filters it).
        generation_prompt: end the prompt with the assistant's turn opening.
        prefill: text of the final assistant message that the answer continues (None: none).
        boundaries: further prompt positions where a tail is stored.
        params: the fields errors are named under.
        call_prefix: the prefix of the ids given to the answer's tool calls.
        echo_arguments: a call's arguments (JSON text) as the dialect's client sends them back
            in a later request's history, when not as returned (Anthropic's ``input`` is an
            object, serialized again): what render-ahead renders.
        prompt_of: the prompt to compute for the chat's rendered ids (default: those ids), e.g. a
            conversation's stored ids continued (``proxy.responses``).
        left_out: client metadata the dialect left out of ``messages``
            (``proxy.serving.metadata``), reported by the explanation.
        warnings: what the dialect did not do as the body asked, one ASCII line each (answered in
            ``x-kvproxy-warning``, ``proxy.http.warnings``, with the answer plan's).
    """

    model: str
    tenant: str
    messages: list[TemplateMessage] | None = None
    prompt: str | list[int] | None = None
    tools: ToolSet | None = None
    schema: dict[str, Any] | None = None
    schema_strict: bool = True
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    to_window: bool = False
    stop: tuple[str, ...] = ()
    ttl: TtlPlan = None
    marks: tuple[CacheMark, ...] = ()
    top_logprobs: int = 0
    template_kwargs: dict[str, Any] | None = None
    generation_prompt: bool = True
    prefill: str | None = None
    boundaries: tuple[int, ...] = ()
    params: Params = field(default_factory=Params)
    call_prefix: str = "call_"
    echo_arguments: Callable[[str], str] | None = None
    prompt_of: Callable[[list[int]], list[int]] | None = None
    left_out: tuple[LeftOut, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rendered:
    """A turn's prompt: its token ids (after ``Turn.prompt_of``), the ids the template rendered,
    and what the template got (messages with the tools written in, tool definitions, data)."""

    ids: list[int]
    rendered: list[int]
    messages: list[TemplateMessage] = field(default_factory=list)
    tools: list[OpenAITool] | None = None
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class Usage:
    """Token counts of one turn: the prompt's (of them ``cached_tokens`` read from the cache,
    ``written_tokens`` newly stored: ``proxy.serving.running.written_tokens``) and the answer's.
    Each dialect shapes its wire ``usage`` from these."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    written_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens neither read from the cache nor newly stored in it."""
        return self.prompt_tokens - self.cached_tokens - self.written_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
