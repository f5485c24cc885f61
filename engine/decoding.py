"""The decode step: the next token of every running sequence in one pass over the weights.

Three implementations of one contract (``Decoder``):

- ``engine.kernels.native.NativeDecoder``: the whole step in one C++ call, on the source's block
  codes (``source`` weights) or float32 rows; pre-norm Llama-family decoders on the CPU.
- ``LeanDecoder`` walks the model's own modules (norms, projections, rotary embedding, MLP, head;
  Gemma's soft-capping and extra norms too) layer by layer with nothing else: no masks to build,
  no output recording, no cache objects beyond each sequence's own K/V. For a small model on a
  CPU, transformers' general forward spends more time in Python than in arithmetic for one
  token; this step does not.
- ``TransformersDecoder`` is transformers' own forward (``engine.forward``), for every model.

``pick_decoder`` takes the first of native, lean that supports the model and, checked on the
loaded model, computes the same logits as transformers' forward; anything else decodes through
transformers. Prefill runs transformers' forward, but for a short uncached suffix on the native
step (``engine.runner.STEPPED_SUFFIX_TOKENS``), which takes it as one multi-token step (``feed``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from engine.buffers import BufferPool
from engine.forward import decode_batch, decode_step, prefill
from engine.kernels.native import NativeDecoder
from engine.kernels.native import unsupported as native_unsupported
from engine.kv import past_from_blocks
from engine.lean_layers import LayerStep, decode_fn
from engine.model.layers import layer_windows
from engine.model.loading import LoadedModel

log = logging.getLogger(__name__)


class Decoder(Protocol):
    """Feed token ``token_ids[b]`` at position ``positions[b]`` on ``pasts[b]`` (each grows by one
    position) and return the next-token logits ``[batch, vocab_size]`` float32."""

    name: str
    """What computes the step (``"lean"``, ``"transformers"``), as ``/health`` reports it."""

    def __call__(
        self, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
    ) -> torch.Tensor: ...


class TransformersDecoder:
    """transformers' forward, batched with per-row attention (``engine.forward.decode_batch``)."""

    name = "transformers"

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(
        self, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
    ) -> torch.Tensor:
        if len(token_ids) == 1:
            return decode_step(self.model, token_ids[0], pasts[0], positions[0]).unsqueeze(0)
        return decode_batch(self.model, token_ids, pasts, positions)


class LeanDecoder:
    """The decode step over a pre-norm decoder's modules (see the module docstring).

    Raises:
        ValueError: the model does not have the expected modules (``LeanDecoder.unsupported``).
    """

    name = "lean"

    def __init__(self, model: Any) -> None:
        if (reason := self.unsupported(model)) is not None:
            raise ValueError(reason)
        inner, config = model.model, model.config
        self.embed, self.norm, self.rotary = inner.embed_tokens, inner.norm.forward, inner.rotary_emb
        self.head = decode_fn(model.lm_head)
        self.softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2
        family = importlib.import_module(type(model).__module__)
        windows = layer_windows(config)
        self.layers = [LayerStep(layer, family, w) for layer, w in zip(inner.layers, windows, strict=True)]
        # NOTE: Gemma 3's rotary embedding has a base per layer type (local and global layers)
        self.types: list[str | None] = [None] * len(self.layers)
        if "layer_type" in inspect.signature(self.rotary.forward).parameters:
            self.types = list(config.layer_types)

    @staticmethod
    def unsupported(model: Any) -> str | None:
        """Why the lean step cannot run this model, or None."""
        inner = getattr(model, "model", None)
        if inner is None or not all(
            hasattr(inner, a) for a in ("embed_tokens", "norm", "rotary_emb", "layers")
        ):
            return "not a decoder with embed_tokens, layers, norm and rotary_emb"
        if not hasattr(importlib.import_module(type(model).__module__), "apply_rotary_pos_emb"):
            return "no apply_rotary_pos_emb beside the model"
        layer = inner.layers[0]
        if not all(
            hasattr(layer, a) for a in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
        ):
            return "layers are not pre-norm (input_layernorm, self_attn, post_attention_layernorm, mlp)"
        if hasattr(layer, "pre_feedforward_layernorm") != hasattr(layer, "post_feedforward_layernorm"):
            return "layers have one feed-forward norm of Gemma's two"
        attn = layer.self_attn
        if getattr(attn, "attn_logit_softcapping", None) and not hasattr(
            importlib.import_module(type(model).__module__), "eager_attention_forward"
        ):
            return "soft-capped attention without an eager_attention_forward beside the model"
        if not (hasattr(attn, "qkv_proj") or all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj"))):
            return "attention has no q/k/v projections"
        return None

    @torch.inference_mode()
    def __call__(
        self, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
    ) -> torch.Tensor:
        device = self.embed.weight.device
        rows = len(token_ids)
        x = self.embed(torch.tensor(token_ids, device=device))  # [rows, hidden]
        at = torch.tensor(positions, device=device).view(rows, 1)
        rotary = {  # cos, sin: [rows, 1, head_dim]
            kind: self.rotary(x, at) if kind is None else self.rotary(x, at, kind) for kind in set(self.types)
        }
        for i, (step, kind) in enumerate(zip(self.layers, self.types, strict=True)):
            cos, sin = rotary[kind]
            x = step(x, cos, sin, [past.layers[i] for past in pasts])
        logits = self.head(self.norm(x))
        if self.softcap:  # NOTE: as transformers' Gemma 2 head: logits / cap, tanh, * cap
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()


def feed(decoder: Decoder, token_ids: Sequence[int], past: DynamicCache, start: int) -> torch.Tensor:
    """Feed a known run of one sequence's tokens, ``token_ids[i]`` at position ``start + i`` on
    ``past`` (positions ``[0, start)``; it grows by the run): the logits ``[len(token_ids), vocab]``
    float32, row i the distribution after token i. The native step takes the run in one call per
    ``MAX_RUN_TOKENS`` (``NativeDecoder.run``, bit for bit its single steps); any other decoder one
    step a token. ``token_ids``: at least one."""
    assert token_ids, "an empty run"
    if isinstance(decoder, NativeDecoder):
        return decoder.run(token_ids, past, start)
    return torch.cat([decoder([token], [past], [start + i]) for i, token in enumerate(token_ids)])


def pick_decoder(loaded: LoadedModel, like: torch.Tensor, threads: int) -> Decoder:
    """The fastest step that supports the model and agrees with transformers' forward on it (one
    decode step after a short prefill, batched and alone): the native step (on the source's codes
    in the ``source`` format), else the lean step, else transformers' forward.

    Args:
        like: a tensor ``[num_layers, num_kv_heads, any, head_dim]`` of the K/V dtype and device.
        threads: the native step's OpenMP team size.
    """
    model = loaded.model
    reference = TransformersDecoder(model)
    candidates: list[tuple[str, Callable[[], Decoder] | str]] = []
    lib = loaded.kernels
    if loaded.device.type != "cpu":
        candidates.append(("native", "it runs on the CPU"))
    elif lib is None:
        candidates.append(("native", loaded.kernel_error or "it was not built"))
    else:
        reason = native_unsupported(model)
        candidates.append(("native", reason or (lambda: NativeDecoder(model, loaded.codes, lib, threads))))
    lean_reason = LeanDecoder.unsupported(model)
    candidates.append(("lean", lean_reason if lean_reason is not None else lambda: LeanDecoder(model)))
    skipped = []
    level = logging.WARNING if loaded.kernel_error else logging.INFO
    for name, make in candidates:
        if isinstance(make, str):
            skipped.append(f"{name}: {make}")
            continue
        try:
            decoder = make()
            difference = _disagreement(decoder, reference, like)
        except Exception as exc:  # a module that does not fit the step's wiring
            skipped.append(f"{name}: it failed on this model ({type(exc).__name__}: {exc})")
            continue
        scale = 1e-4 if like.dtype == torch.float32 else 1e-2
        if difference <= scale:
            team = f", {threads} threads" if name == "native" else ""
            passed = "".join(f"; {reason}" for reason in skipped)
            # NOTE: a kernel that could not be built is a fault to fix (a warning, once, naming why)
            slower = ", several times slower than native" if loaded.kernel_error else ""
            log.log(
                level,
                "decode step: %s%s%s (max relative logit difference %.1e%s)",
                decoder.name,
                team,
                slower,
                difference,
                passed,
            )
            return decoder
        skipped.append(f"{name}: its logits differ from transformers' by {difference:.2e} (relative)")
    log.log(level, "decode step: transformers' forward (%s)", "; ".join(skipped))
    return reference


CHECKED_WINDOW = 512
"""Sliding windows up to this many tokens are crossed by the start-up check's prompts (a longer
one would cost a long prefill at every start; the tests cross such windows)."""


def _disagreement(candidate: Decoder, reference: TransformersDecoder, like: torch.Tensor) -> float:
    """Max |lean - reference| logits over two decode steps, relative to the largest logit; the
    prompts are longer than the model's shortest sliding window, up to ``CHECKED_WINDOW``."""
    pool = BufferPool(like, keep=0, granule=16)
    windows = [w for w in layer_windows(reference.model.config) if w is not None and w <= CHECKED_WINDOW]
    extra = min(windows, default=0)
    prompts = [[1 + i % 7 for i in range(extra + 5)], [6 + i % 3 for i in range(extra + 3)]]
    results = []
    for decoder in (candidate, reference):
        pasts = [past_from_blocks([], 0, pool.acquire(len(p) + 2)) for p in prompts]
        with torch.inference_mode():
            for prompt, past in zip(prompts, pasts, strict=True):
                prefill(reference.model, prompt, past, 0)
            positions = [len(p) for p in prompts]
            batched = decoder([9, 10], pasts, positions)
            alone = decoder([11], pasts[:1], [positions[0] + 1])
        results.append(torch.cat([batched, alone]))
    ours, theirs = results
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-6))
