"""Load a model for serving: resolve it (``engine.model.resolve``), choose its formats
(``engine.model.formats``), load weights and tokenizer, read the source's codes
(``engine.model.codes``) and build the native decode step's library (``engine.kernels``), and
probe the K/V it produces.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.kernels.build import KernelUnavailable
from engine.kernels.build import load as load_kernels
from engine.model.chat_template import use_chat_template
from engine.model.codes import Codes, source_codes
from engine.model.convert import convert_gguf
from engine.model.fetch import SOURCE_GGUF, ModelError
from engine.model.formats import Dtype, DtypeChoice, WeightsChoice, resolve_formats
from engine.model.layers import describe, layer_windows, refusal
from engine.model.resolve import model_fingerprint, resolve_model_dir
from hashing import Namespace, NamespaceIdentity
from store.block_format import BlockFormat
from store.interface import KVSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve.

    Attributes:
        name: the id served in ``/v1/models`` and accepted in requests' ``model`` field.
        model: a transformers causal LM in eval mode (prefill runs its forward).
        tokenizer: its tokenizer, with the chat template.
        base_identity: the cache identity of its K/V (fingerprint, formats, device), of no tenant
            yet: ``identity(tenant)`` completes it.
        kv_spec: the shape and dtype of the K/V it produces.
        context_length: maximum tokens (prompt + completion).
        eos_token_ids: token ids that end a completion.
        aliases: further names requests may use for it (``--served-model-name``).
        codes: the source's block codes by parameter name (``weights == "source"``), else empty.
        kernels: the native decode step's library (``engine.kernels.build``), or None off the CPU
            or where it cannot be built (the decode step is then torch's).
        kernel_error: why the library could not be read, built or loaded on the CPU, or None (said
            in the decode step's log line, ``engine.decoding.pick_decoder``).
    """

    name: str
    model: Any
    tokenizer: Any
    base_identity: NamespaceIdentity
    kv_spec: KVSpec
    context_length: int
    eos_token_ids: frozenset[int]
    aliases: tuple[str, ...] = ()
    codes: dict[str, Codes] = field(default_factory=dict)
    kernels: ctypes.CDLL | None = None
    kernel_error: str | None = None

    @property
    def fingerprint(self) -> str:
        """Hex digest of the weight files and config (``engine.model.resolve.model_fingerprint``)."""
        return self.base_identity.model_fingerprint

    @property
    def weights(self) -> str:
        """What the decode step computes on: ``"source"`` (the GGUF's codes) or ``"full"``."""
        return self.base_identity.weights

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name requests may use: ``name``, then the other aliases."""
        return (self.name, *(a for a in self.aliases if a != self.name))

    @property
    def device(self) -> torch.device:
        """Where the weights (and so every K/V and logits tensor) live."""
        return cast(torch.device, self.model.get_input_embeddings().weight.device)

    @property
    def format(self) -> str:
        """E.g. ``"float32 activations and K/V, source weights, on cpu"`` (then, for a lossy block
        format, ``", int8 blocks at rest"``)."""
        fmt = self.kv_spec.block_format
        at_rest = f", {fmt} blocks at rest" if fmt != "exact" else ""
        return (
            f"{self.kv_spec.dtype} activations and K/V, {self.weights} weights, on {self.device.type}"
            + at_rest
        )

    @property
    def attention(self) -> str:
        """What the layers attend to, e.g. ``"30 layers, full attention"`` (``engine.model.layers``)."""
        return describe(layer_windows(self.model.config))

    def with_block_format(self, block_format: BlockFormat) -> LoadedModel:
        """This model with its blocks held at rest in ``block_format`` (``store.codec``), part of
        its K/V's identity; a lossy format that is the model's own K/V dtype is exact."""
        block_format = "exact" if block_format == self.kv_spec.dtype else block_format
        return dataclasses.replace(
            self,
            kv_spec=dataclasses.replace(self.kv_spec, block_format=block_format),
            base_identity=dataclasses.replace(self.base_identity, block_format=block_format),
        )

    def with_chat_template(self, template: str | None) -> LoadedModel:
        """This model rendering chats with ``template`` (Jinja text; None: unchanged), on a copy of
        its tokenizer (the original, which others may share, keeps its own)."""
        if template is None:
            return self
        tokenizer = copy.copy(self.tokenizer)
        use_chat_template(tokenizer, template)
        return dataclasses.replace(self, tokenizer=tokenizer)

    def identity(self, tenant: str) -> NamespaceIdentity:
        """The cache identity of ``tenant``'s K/V computed by this model, formats and device."""
        return _for_tenant(self.base_identity, tenant)

    def namespace(self, tenant: str) -> Namespace:
        """The cache namespace of ``tenant`` (``identity(tenant).digest()``)."""
        return self.identity(tenant).digest()


@lru_cache(maxsize=4096)
def _for_tenant(base: NamespaceIdentity, tenant: str) -> NamespaceIdentity:
    # NOTE: kept, so each tenant's digest is computed once
    return base.for_tenant(tenant)


def load_model(
    spec: str,
    *,
    cache_dir: Path,
    dtype: DtypeChoice = "auto",
    weights: WeightsChoice = "auto",
    device: str = "cpu",
    chat_template: str | None = None,
) -> LoadedModel:
    """Resolve, load and check a model, in its formats (``engine.model.formats``).

    Args:
        chat_template: Jinja text that replaces the tokenizer's own chat template (``--chat-template``;
            ``engine.model.chat_template``), or None to keep the model's.

    Raises:
        ModelError: missing model, unsupported architecture (not a decoder-only model whose
            layers are all full or sliding-window attention: ``engine.model.layers.refusal``), an
            unknown or impossible format, or a device that is not there.
    """
    kind = device_kind(device)
    name, model_dir = resolve_model_dir(spec, cache_dir, convert_gguf)
    kernels, kernel_error, blocker = None, None, None
    try:
        # NOTE: only for the CPU: the library's native step and K/V gather run nowhere else
        kernels = load_kernels(Path(cache_dir)) if kind == "cpu" else None
    except KernelUnavailable as exc:
        # NOTE: why is said once: by the decode step's line, or by --weights source's refusal
        kernel_error = str(exc)
        blocker = "no native decode step" + ("" if weights == "auto" else f" ({exc})")
    if blocker is None and not (model_dir / SOURCE_GGUF).is_file():
        blocker = "the model has no GGUF source"
    dtype, fmt = resolve_formats(dtype, weights, kind, blocker)
    try:
        # NOTE: the layers are checked before the weights load: a refusal comes at once
        if (reason := refusal(AutoConfig.from_pretrained(model_dir, local_files_only=True))) is not None:
            raise ModelError(reason)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        use_chat_template(tokenizer, chat_template)
        # NOTE: device_map (accelerate) puts each weight straight on the device: the host never
        # holds a second copy of the whole model.
        placement = {} if device == "cpu" else {"device_map": device}
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), local_files_only=True, **placement
        )
    except (ValueError, OSError, KeyError) as exc:
        raise ModelError(f"cannot load {model_dir} as a causal language model: {exc}") from exc
    model.eval()
    kv_spec = _probe_kv_spec(model, dtype)
    fingerprint = model_fingerprint(model_dir, Path(cache_dir))
    codes = {}
    if fmt == "source":
        verified = Path(cache_dir) / "fingerprints" / f"codes-{fingerprint}.json"
        codes = source_codes(model_dir / SOURCE_GGUF, dict(model.named_parameters()), model.config, verified)
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    loaded = LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        base_identity=NamespaceIdentity(
            model_fingerprint=fingerprint,
            kv_dtype=kv_spec.dtype,
            tenant="",
            weights=fmt,
            device=model.get_input_embeddings().weight.device.type,
        ),
        kv_spec=kv_spec,
        context_length=int(getattr(model.config, "max_position_embeddings", 2048)),
        eos_token_ids=frozenset(eos_ids),
        codes=codes,
        kernels=kernels,
        kernel_error=kernel_error,
    )
    log.info("attention: %s", loaded.attention)
    return loaded


def device_kind(device: str) -> str:
    """The kind of ``device`` (``"cpu"``, ``"cuda"``, ...), once a tensor could be made on it.

    Raises:
        ModelError: not a torch device name, or none such here (e.g. ``cuda`` with a CPU build).
    """
    try:
        kind = torch.device(device).type
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:  # NOTE: a CPU build's CUDA check is an assert
        raise ModelError(f"--device {device!r} cannot be used here: {exc}") from None
    return kind


def load_model_apart(spec: str, **options: Any) -> LoadedModel:
    """``load_model`` on a thread of its own that ends afterwards.

    NOTE: loading runs parallel operations, which give the loading thread an OpenMP team; a team
    outlives its work as long as its thread does, and more team threads than cores slow the
    model thread's every operation (see ``engine.worker``). A thread that ends takes its team.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="kvproxy-load") as pool:
        return pool.submit(load_model, spec, **options).result()


@torch.inference_mode()
def _probe_kv_spec(model: Any, dtype: Dtype) -> KVSpec:
    """Run one token and read the K/V layout off the cache the model returns.

    Raises:
        ModelError: the cache is not made of per-position K/V layers.
    """
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True)
    cache = out.cache
    # NOTE: a sliding-window layer of transformers' own cache keeps only the window; kvproxy's
    # keeps the whole past (engine.model.layers), but the shapes read here are the same
    if not isinstance(cache, DynamicCache) or not all(
        isinstance(layer, DynamicLayer) for layer in cache.layers
    ):
        raise ModelError(f"{model.config.model_type} does not use a plain dynamic KV cache; unsupported")
    key = cast(torch.Tensor, cast(DynamicLayer, cache.layers[0]).keys)
    return KVSpec(num_layers=len(cache.layers), num_kv_heads=key.shape[1], head_dim=key.shape[3], dtype=dtype)
