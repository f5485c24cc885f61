"""The decode step: the next token of every running sequence in one pass over the weights.

Two implementations of one contract (``Decoder``):

- ``LeanDecoder`` walks the model's own modules (norms, projections, rotary embedding, MLP, head)
  layer by layer with nothing else: no masks to build, no output recording, no cache objects
  beyond each sequence's own K/V. For a small model on a CPU, transformers' general forward
  spends more time in Python than in arithmetic for one token; this step does not.
- ``TransformersDecoder`` is transformers' own forward (``engine.forward``), for every model.

``pick_decoder`` uses the lean step only for models whose layers have the standard pre-norm
shape (Llama, Mistral, Qwen2, Qwen3, Phi-3, ...) and only after checking, on the loaded model,
that it computes the same logits as transformers' forward; anything else decodes through
transformers. Prefill always runs transformers' forward.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama import modeling_llama as _llama

from engine.forward import decode_batch, decode_step, prefill
from engine.kv import BufferPool, past_from_blocks
from engine.loading import sliding_window
from engine.quantize import QuantizedLinear, can_fuse, decode_kernels, fused

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
        with decode_kernels():
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
        inner = model.model
        self.embed, self.norm, self.rotary = inner.embed_tokens, inner.norm.forward, inner.rotary_emb
        self.head = _decode_fn(model.lm_head)
        rope = importlib.import_module(type(model).__module__).apply_rotary_pos_emb
        self.layers = [_LayerStep(layer, rope) for layer in inner.layers]

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
        config = model.config
        for flag in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, flag, None):
                return f"config.{flag} is set"
        if sliding_window(config):
            return "its attention has a sliding window"
        layer = inner.layers[0]
        if not all(
            hasattr(layer, a) for a in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
        ):
            return "layers are not pre-norm (input_layernorm, self_attn, post_attention_layernorm, mlp)"
        if hasattr(layer, "pre_feedforward_layernorm") or hasattr(layer, "post_feedforward_layernorm"):
            return "layers have extra feed-forward norms"
        attn = layer.self_attn
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
        cos, sin = self.rotary(x, torch.tensor(positions, device=device).view(rows, 1))  # [rows, 1, head_dim]
        with decode_kernels():
            for i, step in enumerate(self.layers):
                x = step(x, cos, sin, [past.layers[i] for past in pasts])
            return self.head(self.norm(x)).float()


def _same_code(fn: Any, reference: Any) -> bool:
    """Whether ``fn`` is the same Python code as ``reference`` (transformers copies one function
    into each model family's file; the copies compute the same thing)."""
    code, ref = getattr(fn, "__code__", None), reference.__code__
    return code is not None and (code.co_code, code.co_names) == (ref.co_code, ref.co_names)


def _norm_fn(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The norm's computation: for a Llama-family RMSNorm, the same arithmetic with the
    normalisation in one fused operation (in float32, then rounded and scaled as transformers
    does); else the module's own forward."""
    if not _same_code(getattr(type(module), "forward", None), _llama.LlamaRMSNorm.forward):
        return cast(Callable[[torch.Tensor], torch.Tensor], module.forward)
    weight, eps = module.weight, module.variance_epsilon

    def norm(x: torch.Tensor) -> torch.Tensor:
        return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)

    return norm


def _decode_fn(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """A layer's decode computation on ``[rows, features]``, without ``nn.Module.__call__``'s
    hook machinery: the quantized kernel itself for a quantized layer."""
    return module.rows_kernel() if isinstance(module, QuantizedLinear) else module.forward


class _LayerStep:
    """One pre-norm decoder layer for one new token per row (activations ``[rows, hidden]``): the
    same operations, in the same order, as transformers' forward of that layer, with the
    projections that share their input computed by one quantized kernel (bit for bit the same:
    the kernels compute every output column on its own)."""

    def __init__(self, layer: Any, rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = _norm_fn(layer.input_layernorm), _norm_fn(layer.post_attention_layernorm)
        self.rope = rope
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.heads, self.kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        sizes = [self.heads, self.kv_heads, self.kv_heads]
        self.sizes = [n * self.head_dim for n in sizes]
        projections = (
            [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
        )
        self.qkv = [_decode_fn(p) for p in _fuse(projections)]
        # NOTE: with q, k, v from one kernel and Llama's rotation, q and k are rotated in one go
        # (the same element-wise operations, on both at once).
        self.joint_rope = (
            len(self.qkv) == 1 and self.q_norm is None and _same_code(rope, _llama.apply_rotary_pos_emb)
        )
        self.o = _decode_fn(attn.o_proj)
        self.mlp: Callable[[torch.Tensor], torch.Tensor] = mlp.forward
        if all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            gate_up = [_decode_fn(p) for p in _fuse([mlp.gate_proj, mlp.up_proj])]
            act = F.silu if isinstance(mlp.act_fn, torch.nn.SiLU) else mlp.act_fn
            self.mlp = _GatedMlp(gate_up, mlp.gate_proj.out_features, act, _decode_fn(mlp.down_proj))

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        x = x + self._attention(self.norm1(x), cos, sin, caches)
        return x + self.mlp(self.norm2(x))

    def _attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        """Project, rotate, append to each row's K/V, attend, project out."""
        rows, qkv = x.shape[0], [p(x) for p in self.qkv]
        if self.joint_rope:
            heads = qkv[0].view(rows, -1, self.head_dim)  # [rows, q + k + v heads, head_dim]
            qk, v = heads[:, : self.heads + self.kv_heads], heads[:, self.heads + self.kv_heads :]
            qk = (qk * cos) + (_llama.rotate_half(qk) * sin)
            q, k = qk[:, : self.heads].unsqueeze(2), qk[:, self.heads :].unsqueeze(2)
            v = v.unsqueeze(2)  # q, k, v: [rows, heads, 1, head_dim]
        else:
            q, k, v = qkv[0].split(self.sizes, dim=-1) if len(qkv) == 1 else qkv
            q, k, v = (t.view(rows, -1, self.head_dim) for t in (q, k, v))
            if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head norms first
                q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.unsqueeze(2) for t in (q, k, v))
            q, k = self.rope(q, k, cos, sin)
        attend = F.scaled_dot_product_attention
        outputs = []
        for b, cache in enumerate(caches):
            keys, values = cache.update(k[b : b + 1], v[b : b + 1])
            outputs.append(attend(q[b : b + 1], keys, values, scale=self.scaling, enable_gqa=True))
        out = outputs[0] if rows == 1 else torch.cat(outputs)
        return self.o(out.reshape(rows, -1))


class _GatedMlp:
    """``down(act(gate(x)) * up(x))``, as transformers' Llama-family MLPs compute it."""

    def __init__(
        self,
        gate_up: list[Callable[..., torch.Tensor]],
        width: int,
        act: Any,
        down: Callable[..., torch.Tensor],
    ) -> None:
        self.gate_up, self.width, self.act, self.down = gate_up, width, act, down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.gate_up) == 1:
            gate, up = self.gate_up[0](x).split(self.width, dim=-1)
        else:
            gate, up = (p(x) for p in self.gate_up)
        return self.down(self.act(gate) * up)


def _fuse(projections: list[Any]) -> list[Any]:
    """Projections of one input as one fused quantized layer where they can fuse; else as they are."""
    return [fused(projections)] if len(projections) > 1 and can_fuse(projections) else projections


def pick_decoder(model: Any, like: torch.Tensor) -> Decoder:
    """The lean step when it supports ``model`` and agrees with transformers' forward on it (one
    decode step after a short prefill, batched and alone); else transformers' forward.

    Args:
        like: a tensor ``[num_layers, num_kv_heads, any, head_dim]`` of the K/V dtype and device.
    """
    reference = TransformersDecoder(model)
    reason = LeanDecoder.unsupported(model)
    if reason is None:
        lean = LeanDecoder(model)
        try:
            difference = _disagreement(lean, reference, like)
        except Exception as exc:  # a module that does not fit the lean step's wiring
            reason = f"it failed on this model ({type(exc).__name__}: {exc})"
        else:
            scale = 1e-4 if like.dtype == torch.float32 else 1e-2
            if difference <= scale:
                log.info("decode step: lean (max relative logit difference to transformers %.1e)", difference)
                return lean
            reason = f"its logits differ from transformers' by {difference:.2e} (relative)"
    log.info("decode step: transformers' forward (the lean step does not apply: %s)", reason)
    return reference


def _disagreement(lean: LeanDecoder, reference: TransformersDecoder, like: torch.Tensor) -> float:
    """Max |lean - reference| logits over two decode steps, relative to the largest logit."""
    pool = BufferPool(like, keep=0, granule=16)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    results = []
    for decoder in (lean, reference):
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
