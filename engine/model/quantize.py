"""Weight formats: the linear layers' weights as loaded (``full``), or quantized to 4 or 8 bits for
the decode step.

``int4``: asymmetric 4-bit weights in groups of 32 along the input dimension, in the layout of
PyTorch's CPU "tinygemm" kernel (``aten._weight_int4pack_mm_for_cpu``, the kernel torchao's int4
weight-only quantization uses on CPU): per group ``scale = (max - min) / 15`` and
``zero = min + 8 * scale``, weights ``q = round((w - min) / scale)`` in ``0..15``, so
``w ~ (q - 8) * scale + zero``. The default model's weights come from a Q4_1 file (4 bits, groups
of 32), so this loses almost nothing against the source. ``int8``: symmetric 8-bit weights, one
scale per output channel (``aten._weight_int8pack_mm``).

Only weights are quantized, never activations: every row of a batch is computed on its own (the
kernels are row-independent), so a token's result never depends on which tokens share its chunk.
The quantized kernels run the decode step (one token per sequence, where reading the weights is
the cost); a prefill chunk multiplies by the same quantized weights expanded to the activation
dtype, which the dense matrix-multiply kernels do many times faster for hundreds of rows.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

WeightFormat = Literal["full", "int4", "int8"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("full", "int4", "int8")
INT4_GROUP = 32

_phase = threading.local()


@contextlib.contextmanager
def decode_kernels() -> Iterator[None]:
    """Within this block (on this thread), quantized linear layers use their decode kernels."""
    _phase.decoding = True
    try:
        yield
    finally:
        _phase.decoding = False


class QuantizedLinear(nn.Module):
    """A linear layer with quantized weights: the quantized kernel inside ``decode_kernels()``,
    a dense multiply by the dequantized weights elsewhere.

    Args:
        linear: the layer to replace (weight ``[out_features, in_features]``, optional bias).
        fmt: ``"int4"`` or ``"int8"``.
        dtype: the activation dtype (``bfloat16`` or ``float16``).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    dense: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, fmt: WeightFormat, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features, self.fmt = linear.in_features, linear.out_features, fmt
        weight = linear.weight.detach().to(dtype)
        if fmt == "int4":
            packed, scales_zeros, dense = _int4(weight)
            self.register_buffer("packed", packed)
            self.register_buffer("scales", scales_zeros)
        else:
            q, scales, dense = _int8(weight)
            self.register_buffer("packed", q)
            self.register_buffer("scales", scales)
        self.register_buffer("dense", dense)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., in_features]`` -> ``[..., out_features]``."""
        if not getattr(_phase, "decoding", False):
            assert self.dense is not None, "a fused layer only decodes"
            return F.linear(x, self.dense, self.bias)
        return self.decode(x)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """The quantized kernel, whatever the phase: ``[..., in_features]`` -> ``[..., out_features]``."""
        y = self.rows_kernel()(x.reshape(-1, self.in_features))
        return y.reshape(*x.shape[:-1], self.out_features)

    def rows_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The quantized kernel bound to this layer's weights, for ``[rows, in_features]`` inputs."""
        packed, scales, bias = self.packed, self.scales, self.bias
        if self.fmt == "int4":
            int4 = torch.ops.aten._weight_int4pack_mm_for_cpu.default

            def kernel(x: torch.Tensor) -> torch.Tensor:
                return int4(x, packed, INT4_GROUP, scales)
        else:
            int8 = torch.ops.aten._weight_int8pack_mm.default

            def kernel(x: torch.Tensor) -> torch.Tensor:
                return int8(x, packed, scales)

        if bias is None:
            return kernel
        return lambda x: kernel(x) + bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt}"


def fused(layers: list[QuantizedLinear]) -> QuantizedLinear:
    """One decode-only layer computing ``layers`` side by side (outputs concatenated): the
    kernels compute every output column on its own, so the result is bit for bit theirs.

    Raises:
        ValueError: the layers cannot fuse (``can_fuse``).
    """
    if not can_fuse(layers):
        raise ValueError("only bias-free layers of one format and input size fuse (int4: 64-row multiples)")
    first = layers[0]
    out = QuantizedLinear.__new__(QuantizedLinear)
    nn.Module.__init__(out)
    out.in_features, out.fmt, out.bias = first.in_features, first.fmt, None
    out.out_features = sum(q.out_features for q in layers)
    out.register_buffer("packed", torch.cat([q.packed for q in layers]))
    out.register_buffer("scales", torch.cat([q.scales for q in layers], dim=1 if first.fmt == "int4" else 0))
    out.register_buffer("dense", None)
    return out


def _int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, scales_and_zeros [K/32, N, 2], dequantized [N, K])`` of ``weight`` ``[N, K]``."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-6).to(weight.dtype)
    zero = (low + 8 * scale.float()).to(weight.dtype)
    offset = zero.float() - 8 * scale.float()
    q = torch.round((groups - offset[..., None]) / scale.float()[..., None]).clamp(0, 15)
    dequantized = ((q - 8) * scale.float()[..., None] + zero.float()[..., None]).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).to(torch.int32), 1)
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_zeros, dequantized.to(weight.dtype)


def _int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q int8 [N, K], scales [N], dequantized [N, K])`` of ``weight`` ``[N, K]``."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
    q = torch.round(w / scale[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale.to(weight.dtype), (q * scale[:, None]).to(weight.dtype)


def can_fuse(layers: list[Any]) -> bool:
    """Whether ``fused`` applies: quantized, bias-free, one format and input size; for int4 every
    layer's outputs a multiple of 64 (the kernel packs the weights in tiles of 64 rows)."""
    if not layers or not all(isinstance(q, QuantizedLinear) and q.bias is None for q in layers):
        return False
    first = layers[0]
    if any(q.fmt != first.fmt or q.in_features != first.in_features or q.dense is None for q in layers):
        return False
    return first.fmt != "int4" or all(q.out_features % 64 == 0 for q in layers)


def can_quantize(linear: nn.Module, fmt: WeightFormat) -> bool:
    """Whether ``fmt`` applies to this layer (int4 packs groups of 32 inputs and 16 outputs)."""
    if not isinstance(linear, nn.Linear):
        return False
    return fmt != "int4" or (linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0)


def quantize_linears(model: Any, fmt: WeightFormat, dtype: torch.dtype) -> int:
    """Replace every ``nn.Linear`` of ``model`` (the output head included) by a
    ``QuantizedLinear``; returns how many were replaced. ``"full"`` changes nothing.

    Raises:
        ValueError: a quantized format with float32 activations (the CPU kernels need 16-bit
            activations) or off the CPU.
    """
    if fmt == "full":
        return 0
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"--weights {fmt} needs --dtype bfloat16 (or float16); float32 keeps full weights")
    if next(model.parameters()).device.type != "cpu":
        raise ValueError(f"--weights {fmt} runs on the CPU only; use --weights full on other devices")
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if can_quantize(child, fmt):
                setattr(module, name, QuantizedLinear(child, fmt, dtype))
                replaced += 1
    return replaced
