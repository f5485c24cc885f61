"""The C structures of ``decode.cpp`` (``struct Linear``, ``Layer``, ``Model``), field for field:
the native step's whole view of a model. A change to one side must change the other."""

from __future__ import annotations

import ctypes


class Linear(ctypes.Structure):
    """``struct Linear``: a weight matrix ``[rows (out), cols (in)]`` in one of the ``Kind`` formats
    (``engine.model.codes.KINDS``, 0: float32 rows), and an optional float32 bias ``[rows]``."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("rows", ctypes.c_int32),
        ("cols", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("data", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
    ]


class Layer(ctypes.Structure):
    """``struct Layer``: one decoder layer's norms (float32 ``[hidden]``, or ``[head_dim]`` for
    q/k norms; null when absent), projections, and sliding window in positions (0: none)."""

    _fields_ = [
        ("attn_norm", ctypes.c_void_p),
        ("q", Linear),
        ("k", Linear),
        ("v", Linear),
        ("o", Linear),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("ffn_norm", ctypes.c_void_p),
        ("gate", Linear),
        ("up", Linear),
        ("down", Linear),
        ("window", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


class Model(ctypes.Structure):
    """``struct Model``: the shapes, the embedding and head ``[vocab, hidden]``, transformers'
    rotary values ``[max_pos, head_dim]`` float32, and ``layers``, an array of ``n_layers`` ``Layer``."""

    _fields_ = [
        ("n_layers", ctypes.c_int32),
        ("hidden", ctypes.c_int32),
        ("n_heads", ctypes.c_int32),
        ("n_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("inter", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
        ("max_pos", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("embed", Linear),
        ("head", Linear),
        ("final_norm", ctypes.c_void_p),
        ("cos_table", ctypes.c_void_p),
        ("sin_table", ctypes.c_void_p),
        ("layers", ctypes.c_void_p),
    ]
