"""Load a model for serving: resolve the name or path, load weights and tokenizer, probe the KV.

``--model`` accepts a known name (``smollm2-135m-instruct``), a Hugging Face checkpoint directory
(config.json, *.safetensors, tokenizer.json) or a ``.gguf`` file (converted once into the cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import torch
import xxhash
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.fetch import (
    KNOWN_MODELS,
    ModelError,
    convert_gguf,
    fetch_known_model,
    gguf_checkpoint_dir,
    is_checkpoint,
)
from hashing import Namespace, namespace_digest
from store.interface import KVSpec

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve.

    Attributes:
        name: the id served in ``/v1/models`` and accepted in requests' ``model`` field.
        model: a transformers causal LM in eval mode.
        tokenizer: its tokenizer, with the chat template.
        fingerprint: hex digest of the weight files and config (see ``model_fingerprint``).
        kv_spec: the shape and dtype of the K/V it produces.
        context_length: maximum tokens (prompt + completion).
        eos_token_ids: token ids that end a completion.
    """

    name: str
    model: Any
    tokenizer: Any
    fingerprint: str
    kv_spec: KVSpec
    context_length: int
    eos_token_ids: frozenset[int]

    @property
    def device(self) -> torch.device:
        """Where the weights (and so every K/V and logits tensor) live."""
        return next(self.model.parameters()).device

    def namespace(self, tenant: str) -> Namespace:
        """The cache namespace of ``tenant`` for this model's weights and KV dtype."""
        return _namespace(self.fingerprint, self.kv_spec.dtype, tenant)


@lru_cache(maxsize=4096)
def _namespace(fingerprint: str, kv_dtype: str, tenant: str) -> Namespace:
    return namespace_digest(model_fingerprint=fingerprint, kv_dtype=kv_dtype, tenant=tenant)


def resolve_model_dir(spec: str, cache_dir: Path) -> tuple[str, Path]:
    """Map ``--model`` to ``(served name, checkpoint directory)``, fetching/converting as needed.

    Raises:
        ModelError: the path does not exist or is not a checkpoint, or the name is unknown.
    """
    models_dir = Path(cache_dir) / "models"
    if spec in KNOWN_MODELS:
        return spec, fetch_known_model(spec, models_dir)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        target = gguf_checkpoint_dir(path, models_dir)
        if not is_checkpoint(target):
            convert_gguf(path, target)
        return path.stem, target
    if path.is_dir():
        if not is_checkpoint(path):
            raise ModelError(
                f"{path} is not a Hugging Face checkpoint: it needs config.json and *.safetensors"
            )
        return path.name, path
    raise ModelError(
        f"model {spec!r} not found: pass a known name ({', '.join(KNOWN_MODELS)}), a checkpoint "
        "directory or a .gguf file with --model (or KVPROXY_MODEL)"
    )


def model_fingerprint(model_dir: Path) -> str:
    """Hex xxh3-128 over config.json and every ``*.safetensors`` file (names and contents).

    A changed checkpoint under the same name therefore gets a new namespace and never reuses K/V
    computed by the old weights.
    """
    digest = xxhash.xxh3_128()
    for path in [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def load_model(spec: str, *, cache_dir: Path, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """Resolve, load and check a model.

    Raises:
        ModelError: missing model, unsupported architecture (not a decoder-only model whose
            layers are all full attention) or unknown dtype.
    """
    if dtype not in DTYPES:
        raise ModelError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    name, model_dir = resolve_model_dir(spec, cache_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), local_files_only=True
        )
    except (ValueError, OSError, KeyError) as exc:
        raise ModelError(f"cannot load {model_dir} as a causal language model: {exc}") from exc
    model.to(device).eval()
    kv_spec = _probe_kv_spec(model, dtype)
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        fingerprint=model_fingerprint(model_dir),
        kv_spec=kv_spec,
        context_length=int(getattr(model.config, "max_position_embeddings", 2048)),
        eos_token_ids=frozenset(eos_ids),
    )


@torch.inference_mode()
def _probe_kv_spec(model: Any, dtype: str) -> KVSpec:
    """Run one token and read the K/V layout off the cache the model returns.

    Raises:
        ModelError: the model is an encoder-decoder, or any layer is not full attention
            (sliding-window or recurrent layers cannot be rebuilt from 128-token blocks).
    """
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise ModelError(
            f"{config.model_type} is an encoder-decoder model; kvproxy serves decoder-only models"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "sliding_window", None):
        raise ModelError(
            f"{config.model_type} has non-full-attention layers ({set(layer_types) or 'sliding window'}); "
            "kvproxy serves models whose layers are all full attention"
        )
    device = next(model.parameters()).device
    out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True)
    cache = out.cache
    if not isinstance(cache, DynamicCache) or any(
        getattr(layer, "is_sliding", False) for layer in cache.layers
    ):
        raise ModelError(f"{config.model_type} does not use a plain dynamic KV cache; unsupported")
    key = cast(torch.Tensor, cast(DynamicLayer, cache.layers[0]).keys)
    return KVSpec(num_layers=len(cache.layers), num_kv_heads=key.shape[1], head_dim=key.shape[3], dtype=dtype)
