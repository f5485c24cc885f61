"""The source's own quantized weights: the block codes of a GGUF file, for the native decode step.

A GGUF file stores each matrix as ggml blocks of 32 weights along a row (``Q4_0``, ``Q4_1``,
``Q8_0``: an fp16 scale, for ``Q4_1`` an fp16 minimum, then 4- or 8-bit codes; ggml's
``ggml-common.h``). The float32 checkpoint kvproxy converts the file into holds exactly those
codes de-quantized. Here each matrix's codes are read back, rows reordered as the conversion
reordered them (llama's query and key rows, ``transformers.modeling_gguf_pytorch_utils``), and
checked: de-quantized, they must equal the checkpoint's weight bit for bit, or the matrix is
served from its float32 weight instead (said in the log). Other GGUF types are de-quantized.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

BLOCK = 32
KINDS = {"Q4_0": 1, "Q4_1": 2, "Q8_0": 3}
"""GGUF block types the native step computes on (its ``Kind`` codes)."""
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}

NAMES = {
    r"token_embd\.weight": "model.embed_tokens.weight",
    r"output\.weight": "lm_head.weight",
    r"blk\.(\d+)\.attn_q\.weight": r"model.layers.\1.self_attn.q_proj.weight",
    r"blk\.(\d+)\.attn_k\.weight": r"model.layers.\1.self_attn.k_proj.weight",
    r"blk\.(\d+)\.attn_v\.weight": r"model.layers.\1.self_attn.v_proj.weight",
    r"blk\.(\d+)\.attn_output\.weight": r"model.layers.\1.self_attn.o_proj.weight",
    r"blk\.(\d+)\.ffn_gate\.weight": r"model.layers.\1.mlp.gate_proj.weight",
    r"blk\.(\d+)\.ffn_up\.weight": r"model.layers.\1.mlp.up_proj.weight",
    r"blk\.(\d+)\.ffn_down\.weight": r"model.layers.\1.mlp.down_proj.weight",
}
"""GGUF tensor names -> the checkpoint's parameter names (llama.cpp's ``gguf`` naming)."""


@dataclass(frozen=True)
class Codes:
    """One matrix as its source stores it.

    Attributes:
        kind: the GGUF block type (``"Q4_1"``, ...).
        rows, cols: the matrix's shape ``[out, in]``; ``cols`` is a multiple of 32.
        data: ``[rows, cols / 32 * block bytes]`` uint8, row-major, contiguous.
    """

    kind: str
    rows: int
    cols: int
    data: torch.Tensor


def dequantize(kind: str, data: np.ndarray) -> np.ndarray:
    """``[rows, cols]`` float32 weights of ``[rows, bytes]`` blocks of ``kind`` (as gguf-py and
    transformers compute them: scale times code, plus the minimum, in float32)."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, BLOCK_BYTES[kind])
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    if kind == "Q8_0":
        q = blocks[:, :, 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, -1)
    start = 4 if kind == "Q4_1" else 2
    qs = blocks[:, :, start : start + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.float32)
    if kind == "Q4_0":
        return (d * (q - 8)).reshape(rows, -1)
    m = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * q + m).reshape(rows, -1)


def _row_order(rows: int, heads: int) -> np.ndarray:
    """The row permutation transformers applies to llama's query/key matrices (``heads`` heads)."""
    index = np.arange(rows)
    return index.reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(rows)


def source_codes(
    gguf_path: Path, weights: dict[str, torch.Tensor], config: Any, verified: Path | None = None
) -> dict[str, Codes]:
    """The codes of every matrix of ``gguf_path`` whose de-quantization equals the checkpoint's
    weight (``weights``: parameter name -> float32 tensor ``[out, in]``), by parameter name.

    Args:
        verified: where the outcome of the comparison is kept (a JSON file): a later load of the
            same GGUF file and checkpoint reads the codes without comparing them again.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    stamp = [gguf_path.stat().st_size, gguf_path.stat().st_mtime_ns]
    known = _read_verified(verified, stamp)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    found: dict[str, Codes] = {}
    orders: dict[str, str] = {}
    dense: list[str] = []
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None or name not in weights:
            continue
        kind = tensor.tensor_type.name
        if kind not in KINDS:
            dense.append(f"{tensor.name} ({kind})")
            continue
        data = np.asarray(tensor.data)
        projection = name.split(".")[-2]
        candidates = {"plain": data}
        if projection in heads:
            candidates = {"permuted": data[_row_order(data.shape[0], heads[projection])]} | candidates
        order = known.get(name) if known is not None else _matching(kind, candidates, weights[name])
        if order not in candidates:
            dense.append(f"{tensor.name} ({kind}, codes differ from the checkpoint)")
            continue
        orders[name] = order
        rows, cols = weights[name].shape
        found[name] = Codes(kind, rows, cols, torch.from_numpy(np.array(candidates[order], copy=True)))
    if dense:
        # NOTE: a K-quant file (Gemma 3's Q4_K_M) lists every tensor: the first few say what it is
        more = f" and {len(dense) - 6} more" if len(dense) > 6 else ""
        log.info("served from float32 weights, not source codes: %s%s", ", ".join(dense[:6]), more)
    if known is None and verified is not None:
        _write_verified(verified, stamp, orders)
    return found


def _matching(kind: str, candidates: dict[str, np.ndarray], weight: torch.Tensor) -> str | None:
    """The candidate row order whose codes de-quantize to ``weight`` exactly, or None."""
    target = weight.detach().float().cpu().numpy()
    return next((o for o, c in candidates.items() if np.array_equal(dequantize(kind, c), target)), None)


def _read_verified(path: Path | None, stamp: list[int]) -> dict[str, str] | None:
    try:
        doc = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return doc["orders"] if isinstance(doc, dict) and doc.get("gguf") == stamp else None


def _write_verified(path: Path, stamp: list[int], orders: dict[str, str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"gguf": stamp, "orders": orders}))
    except OSError:
        pass  # NOTE: a read-only cache only costs the comparison again next time


def _hf_name(gguf_name: str) -> str | None:
    for pattern, replacement in NAMES.items():
        if re.fullmatch(pattern, gguf_name):
            return re.sub(pattern, replacement, gguf_name)
    return None
