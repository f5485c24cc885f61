"""``NativeDecoder``: the decode step in one call into ``decode.cpp`` (built by ``build``).

The whole step, every layer of every running sequence, is one C++ call, its work shared with
helper threads that the step never waits for (``team.h``): no Python between layers, no tensors
allocated per token, the new K/V written straight into each sequence's preallocated buffers
(``engine.kv.GrowingLayer``). Matrices are computed on what holds them: the source's block codes
(``engine.model.codes``) or the checkpoint's float32 rows. ``engine.decoding.pick_decoder`` checks
it against transformers' forward before using it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache

from engine.buffers import GrowingLayer
from engine.kernels.abi import Layer, Linear, Model
from engine.model.codes import KINDS, Codes
from engine.model.layers import layer_windows


def unsupported(model: Any) -> str | None:
    """Why the native step cannot run ``model``, or None (it needs a pre-norm decoder with
    separate or fused q/k/v and gate/up projections, no bias but on q/k/v, float32 weights)."""
    config = model.config
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "not a decoder with layers and a rotary embedding"
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0):
        return "its rotary embedding covers part of each head"
    for flag in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, flag, None):
            return f"config.{flag} is set"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act}, not silu"
    if model.get_input_embeddings().weight.dtype != torch.float32:
        return "its weights are not float32"
    layer = inner.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if not (hasattr(attn, "qkv_proj") or all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj"))):
        return "attention has no q/k/v projections"
    if not (hasattr(mlp, "gate_up_proj") or all(hasattr(mlp, p) for p in ("gate_proj", "up_proj"))):
        return "the MLP has no gate/up projections"
    if getattr(attn.o_proj, "bias", None) is not None or getattr(mlp.down_proj, "bias", None) is not None:
        return "its output projections have biases"
    if hasattr(layer, "pre_feedforward_layernorm") or hasattr(layer, "post_feedforward_layernorm"):
        return "layers have extra feed-forward norms"
    return None


UNIT_BYTES = 64 * 1024
"""Work per unit shared among a step's threads, in bytes read: enough (a few microseconds) to pay for
handing it out, small enough that a unit taken over from a descheduled helper costs little."""


MAX_RUN_TOKENS = 64
"""The most tokens of one sequence ``NativeDecoder.run`` feeds in one step (longer runs go in calls
of this many). NOTE: a step's weights are read once for all its rows, so a run of M tokens costs
about one single step's memory traffic plus M rows of arithmetic; past a few dozen rows the
arithmetic dominates and a longer call gains little, while its scratch (the rows' attention
scores) grows with it. Without AVX-512 (Zen 3, SmolLM2, 1,600-token past) a token cost 117 ms
alone, 50 ms in a run of 4 and 47 ms in a run of 64."""


class NativeDecoder:
    """The native decode step (``engine.decoding.Decoder``) over ``model``'s float32 weights,
    or the source codes ``codes`` (parameter name -> ``Codes``) where given.

    Args:
        lib: the library ``engine.kernels.build.load`` built.
        threads: the threads that compute a step: the caller and ``threads - 1`` helpers.
        unit_bytes: about how much work (bytes of weights or K/V read) each unit of work shared
            among them holds (``UNIT_BYTES``; tests pass small ones to share even a tiny model's).
    """

    def __init__(
        self,
        model: Any,
        codes: dict[str, Codes],
        lib: ctypes.CDLL,
        threads: int,
        unit_bytes: int | None = None,
    ) -> None:
        self.lib, self.threads = lib, threads
        self.unit_bytes = unit_bytes or UNIT_BYTES
        self.name = "native, source codes" if codes else "native"
        self._keep: list[torch.Tensor] = []  # NOTE: every buffer the C structures point into
        config, inner = model.config, model.model
        params = dict(model.named_parameters())
        names = {id(p): n for n, p in params.items()}

        def linear(module: Any, rows: slice | None = None) -> Linear:
            weight = module.weight
            code = codes.get(names.get(id(weight), ""))
            bias = getattr(module, "bias", None)
            if rows is not None:
                bias = bias[rows] if bias is not None else None
            if code is not None:
                data = code.data if rows is None else code.data[rows]
                kind, shape = KINDS[code.kind], (data.shape[0], code.cols)
            else:
                data = weight.detach() if rows is None else weight.detach()[rows]
                kind, shape = 0, tuple(data.shape)
            return Linear(kind, shape[0], shape[1], 0, self._ptr(data), self._ptr(bias))

        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        q_rows = config.num_attention_heads * self.head_dim
        kv_rows = config.num_key_value_heads * self.head_dim
        layers = []
        for layer, window in zip(inner.layers, layer_windows(config), strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            if hasattr(attn, "qkv_proj"):
                q, k, v = (
                    linear(attn.qkv_proj, s)
                    for s in (
                        slice(0, q_rows),
                        slice(q_rows, q_rows + kv_rows),
                        slice(q_rows + kv_rows, None),
                    )
                )
            else:
                q, k, v = linear(attn.q_proj), linear(attn.k_proj), linear(attn.v_proj)
            if hasattr(mlp, "gate_up_proj"):
                inter = mlp.gate_up_proj.weight.shape[0] // 2
                gate, up = (
                    linear(mlp.gate_up_proj, slice(0, inter)),
                    linear(mlp.gate_up_proj, slice(inter, None)),
                )
            else:
                gate, up = linear(mlp.gate_proj), linear(mlp.up_proj)
            norms = [getattr(getattr(attn, n, None), "weight", None) for n in ("q_norm", "k_norm")]
            layers.append(
                Layer(
                    self._ptr(layer.input_layernorm.weight),
                    q,
                    k,
                    v,
                    linear(attn.o_proj),
                    self._ptr(norms[0]),
                    self._ptr(norms[1]),
                    self._ptr(layer.post_attention_layernorm.weight),
                    gate,
                    up,
                    linear(mlp.down_proj),
                    window or 0,
                    0,
                )
            )
        self._layers = (Layer * len(layers))(*layers)
        self.max_pos = int(getattr(config, "max_position_embeddings", 4096))
        cos, sin = self._rotary(inner, self.max_pos)
        embed = model.get_input_embeddings()
        self.vocab = int(model.lm_head.weight.shape[0])
        self._model = Model(
            len(layers),
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            self.head_dim,
            gate.rows,
            self.vocab,
            self.max_pos,
            float(getattr(config, "rms_norm_eps", 1e-6)),
            float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim**-0.5)),
            linear(embed),
            linear(model.lm_head),
            self._ptr(inner.norm.weight),
            self._ptr(cos),
            self._ptr(sin),
            ctypes.cast(self._layers, ctypes.c_void_p),
        )
        self._scratch = torch.empty(0)

    def _ptr(self, tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        tensor = tensor.detach().contiguous()
        self._keep.append(tensor)
        return int(tensor.data_ptr())

    @staticmethod
    @torch.inference_mode()
    def _rotary(inner: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' own rotary values (``cos``, ``sin`` ``[n, head_dim]``) for positions < n."""
        probe = inner.embed_tokens.weight[:1].float().unsqueeze(0)
        cos, sin = inner.rotary_emb(probe, torch.arange(n).unsqueeze(0))
        return cos[0].float().contiguous(), sin[0].float().contiguous()

    @torch.inference_mode()
    def __call__(
        self, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
    ) -> torch.Tensor:
        """One step (``engine.decoding.Decoder``): token ``token_ids[b]`` at position
        ``positions[b]`` on ``pasts[b]``; the logits ``[batch, vocab]``. A past may come more than
        once, at consecutive positions (``run``): each row then attends to the K/V the rows before
        it wrote in this step. Raises ValueError for a position past the model's context."""
        logits = torch.empty((len(token_ids), self.vocab), dtype=torch.float32)
        self._step(token_ids, pasts, positions, logits)
        return logits

    @torch.inference_mode()
    def run(self, token_ids: Sequence[int], past: DynamicCache, start: int) -> torch.Tensor:
        """Feed a known run of one sequence's tokens, ``token_ids[i]`` at position ``start + i``
        on ``past`` (which holds positions ``[0, start)`` and grows by ``len(token_ids)``), in
        calls of at most ``MAX_RUN_TOKENS`` rows, weights read once a call for all of them.

        Returns the logits ``[len(token_ids), vocab]`` float32, row i the distribution after
        token i: bit for bit what ``len(token_ids)`` single steps give, since every row's
        arithmetic is a single step's (see ``kvp_decode``) and row i reads positions
        ``[0, start + i]`` of the past, the rows before it stored in this call before any row
        attends. Raises ValueError for a position past the model's context.
        """
        assert past.get_seq_length() == start, (past.get_seq_length(), start)
        logits = torch.empty((len(token_ids), self.vocab), dtype=torch.float32)
        for offset in range(0, len(token_ids), MAX_RUN_TOKENS):
            chunk = token_ids[offset : offset + MAX_RUN_TOKENS]
            positions = range(start + offset, start + offset + len(chunk))
            self._step(chunk, [past] * len(chunk), positions, logits[offset : offset + len(chunk)])
        return logits

    def _step(
        self,
        token_ids: Sequence[int],
        pasts: Sequence[DynamicCache],
        positions: Sequence[int],
        logits: torch.Tensor,
    ) -> None:
        """One ``kvp_decode`` call, its logits into ``logits`` ``[batch, vocab]`` (contiguous)."""
        batch = len(token_ids)
        n_layers = self._model.n_layers
        keys = (ctypes.c_void_p * (batch * n_layers))()
        values = (ctypes.c_void_p * (batch * n_layers))()
        capacity = (ctypes.c_int64 * batch)()
        # NOTE: every past made room for its furthest position before any pointer is taken:
        # growing a buffer moves it, and a past given several times must not move under the
        # pointers of its earlier rows
        ends: dict[int, tuple[DynamicCache, int]] = {}
        for past, position in zip(pasts, positions, strict=True):
            if position >= self.max_pos:
                raise ValueError(f"position {position} is past the model's context ({self.max_pos})")
            end = ends.get(id(past), (past, 0))[1]
            ends[id(past)] = (past, max(end, position + 1))
        for past, end in ends.values():
            for layer in past.layers:
                cast(GrowingLayer, layer).reserve(end)
        for s, past in enumerate(pasts):
            layers = [cast(GrowingLayer, layer) for layer in past.layers]
            for i, layer in enumerate(layers):
                keys[s * n_layers + i], values[s * n_layers + i] = layer.buffer_pointers()
            capacity[s] = layers[0].capacity
        longest = max(positions) + 1
        need = self.lib.kvp_scratch_floats(ctypes.byref(self._model), batch, longest)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(max(need, 2 * self._scratch.numel()), dtype=torch.float32)
        assert logits.shape == (batch, self.vocab) and logits.is_contiguous(), logits.shape
        tokens = (ctypes.c_int64 * batch)(*token_ids)
        at = (ctypes.c_int64 * batch)(*positions)
        self.lib.kvp_decode(
            ctypes.byref(self._model),
            batch,
            tokens,
            at,
            keys,
            values,
            capacity,
            ctypes.c_void_p(logits.data_ptr()),
            ctypes.c_void_p(self._scratch.data_ptr()),
            self.threads,
            ctypes.c_int64(self.unit_bytes),
        )
        for past, end in ends.values():
            for grown in past.layers:
                cast(GrowingLayer, grown).grow_to(end)
