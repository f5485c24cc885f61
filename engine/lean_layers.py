"""The pieces of the lean decode step (``engine.decoding.LeanDecoder``): a pre-norm decoder layer
(Llama's, or Gemma's with norms after each sublayer too) for one new token per row, its gated MLP
and norms, computed with the model's own weights and operations, in the same order as
transformers' forward of that layer.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama as _llama


def same_code(fn: Any, reference: Any) -> bool:
    """Whether ``fn`` is the same Python code as ``reference`` (transformers copies one function
    into each model family's file; the copies compute the same thing)."""
    code, ref = getattr(fn, "__code__", None), reference.__code__
    return code is not None and (code.co_code, code.co_names) == (ref.co_code, ref.co_names)


def norm_fn(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The norm's computation: for a Llama-family RMSNorm, the same arithmetic with the
    normalisation in one fused operation (in float32, then rounded and scaled as transformers
    does); else the module's own forward."""
    if not same_code(getattr(type(module), "forward", None), _llama.LlamaRMSNorm.forward):
        return cast(Callable[[torch.Tensor], torch.Tensor], module.forward)
    weight, eps = module.weight, module.variance_epsilon

    def norm(x: torch.Tensor) -> torch.Tensor:
        return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)

    return norm


def decode_fn(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """A layer's decode computation on ``[rows, features]``, without ``nn.Module.__call__``'s
    hook machinery."""
    return cast(Callable[[torch.Tensor], torch.Tensor], module.forward)


class LayerStep:
    """One pre-norm decoder layer for one new token per row (activations ``[rows, hidden]``): the
    same operations, in the same order, as transformers' forward of that layer; with a
    ``window`` (tokens), attention reads the last ``window`` positions of each row's past
    (``engine.model.layers``)."""

    def __init__(self, layer: Any, family: ModuleType, window: int | None = None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.start = -window if window else None
        self.norm1 = norm_fn(layer.input_layernorm)
        # NOTE: Gemma's layers norm each sublayer's output too: the attention's through
        # post_attention_layernorm, the MLP's between pre_ and post_feedforward_layernorm
        self.sandwich = hasattr(layer, "pre_feedforward_layernorm")
        if self.sandwich:
            self.post_attn = norm_fn(layer.post_attention_layernorm)
            self.norm2, self.post_mlp = (
                norm_fn(layer.pre_feedforward_layernorm),
                norm_fn(layer.post_feedforward_layernorm),
            )
        else:
            self.norm2 = norm_fn(layer.post_attention_layernorm)
        rope = self.rope = family.apply_rotary_pos_emb
        # NOTE: soft-capped attention scores (Gemma 2) are computed by the family's own eager
        # attention, as transformers' forward of the model does
        self.attn, self.softcap = attn, getattr(attn, "attn_logit_softcapping", None)
        self.eager = family.eager_attention_forward if self.softcap else None
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.heads, self.kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        sizes = [self.heads, self.kv_heads, self.kv_heads]
        self.sizes = [n * self.head_dim for n in sizes]
        projections = (
            [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
        )
        self.qkv = [decode_fn(p) for p in projections]
        # NOTE: with q, k, v from one projection and Llama's rotation, q and k are rotated in one
        # go (the same element-wise operations, on both at once).
        self.joint_rope = (
            len(self.qkv) == 1 and self.q_norm is None and same_code(rope, _llama.apply_rotary_pos_emb)
        )
        self.o = decode_fn(attn.o_proj)
        self.mlp: Callable[[torch.Tensor], torch.Tensor] = mlp.forward
        if all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            gate_up = [decode_fn(p) for p in (mlp.gate_proj, mlp.up_proj)]
            act = F.silu if isinstance(mlp.act_fn, torch.nn.SiLU) else mlp.act_fn
            self.mlp = GatedMlp(gate_up, mlp.gate_proj.out_features, act, decode_fn(mlp.down_proj))

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        if not self.sandwich:
            x = x + self._attention(self.norm1(x), cos, sin, caches)
            return x + self.mlp(self.norm2(x))
        x = x + self.post_attn(self._attention(self.norm1(x), cos, sin, caches))
        return x + self.post_mlp(self.mlp(self.norm2(x)))

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
            keys, values = keys[:, :, self.start :], values[:, :, self.start :]
            if self.eager is not None:
                row = self.eager(
                    self.attn, q[b : b + 1], keys, values, None, scaling=self.scaling, softcap=self.softcap
                )
                outputs.append(row[0].transpose(1, 2))  # NOTE: eager's [1, 1, heads, dim], as SDPA's
            else:
                outputs.append(attend(q[b : b + 1], keys, values, scale=self.scaling, enable_gqa=True))
        out = outputs[0] if rows == 1 else torch.cat(outputs)
        return self.o(out.reshape(rows, -1))


class GatedMlp:
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
