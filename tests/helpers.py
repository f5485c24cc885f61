"""Shared test machinery: block factories, a tiny model built in-process, a server thread, free
ports, a private Redis. Fixtures built from these live in ``tests/conftest.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import torch
import uvicorn
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engine.buffers import BufferPool
from engine.forward import prefill
from engine.kernels.build import load as load_kernels
from engine.kernels.native import NativeDecoder
from engine.kv import past_from_blocks
from engine.prefix_stage import load_prefix
from engine.requests import Event, Failed, Finished, GenerationRequest, PrefillDone, TokenDelta
from engine.sampling import SamplingParams
from engine.worker import Engine
from hashing import BLOCK_SIZE, NamespaceIdentity
from proxy.http.limits import server_config
from store.index.embedded.files import die_with_parent, valkey_binary
from store.interface import KVSpec

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
"""A small K/V layout for store tests that need no model."""
NS = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t").digest()
GREEDY = SamplingParams(temperature=0.0)
HANG_S = 300.0
"""Seconds a test waits for background work it needs (a flush of the cache's writer, a server
starting, a collector's pass) before it calls it a hang. NOTE: generous on purpose: the cache's
background threads run at the lowest CPU priority (``store.background``), so on a busy machine they
are the last to run; a loaded machine must only make a test wait longer, never fail it."""


class Clock:
    """Seconds that pass only when told to (the memory index's clock in store stories)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def kv(num_blocks: int, spec: KVSpec = SPEC) -> tuple[torch.Tensor, torch.Tensor]:
    """Random key and value ``[num_blocks, num_layers, num_kv_heads, 128, head_dim]`` (the layout
    ``PrefixCache.save`` takes)."""
    shape = (num_blocks, spec.num_layers, spec.num_kv_heads, BLOCK_SIZE, spec.head_dim)
    g = torch.Generator().manual_seed(num_blocks)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def random_tokens(n: int, seed: int = 0) -> list[int]:
    """``n`` token ids of the tiny model's vocabulary (no special tokens), reproducibly."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 390, (n,), generator=g).tolist()


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

THINKING_CHATML = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
"""A reasoning-style ChatML template (as Qwen3's and DeepSeek-R1's): the generation prompt opens a
``<think>`` section, and the history drops each earlier answer's reasoning (up to ``</think>``)."""

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. A prefix cache stores attention keys and values "
    "so that a prompt which starts like an earlier one is not computed twice.",
    "Blocks of 128 tokens are named by chained hashes; the longest cached prefix is loaded and "
    "only the suffix is prefilled. What is the capital of France? Paris is.",
]


FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # biased q/k/v projections
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),  # per-head q/k norms
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {"head_dim": 16, "layer_types": ["full_attention"] * 2}),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {"head_dim": 16, "layer_types": ["full_attention"] * 2}),
    "phi3": (Phi3Config, Phi3ForCausalLM, {"sliding_window": None}),  # fused qkv and gate_up
    # sliding windows shorter than the tests' prompts, between block boundaries
    "mistral-window": (MistralConfig, MistralForCausalLM, {"sliding_window": 48}),
    "qwen2-window": (  # layers from max_window_layers on slide
        Qwen2Config,
        Qwen2ForCausalLM,
        {"use_sliding_window": True, "sliding_window": 48, "max_window_layers": 1},
    ),
    "phi3-window": (Phi3Config, Phi3ForCausalLM, {"sliding_window": 48}),
    "gemma2-window": (
        Gemma2Config,
        Gemma2ForCausalLM,
        {  # NOTE: a soft cap the tiny model's attention scores reach (Gemma 2's own is 50)
            "head_dim": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 48,
            "attn_logit_softcapping": 0.01,
        },
    ),
    "gemma3-window": (  # interleaved local and global layers, each with its own rotary base
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "head_dim": 16,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 48,
        },
    ),
}
"""Tiny configurations of each model family kvproxy claims: every layer full attention, and
(``-window``) with sliding-window layers."""


def tiny_tokenizer(chat_template: str = CHATML) -> PreTrainedTokenizerFast:
    """The tiny models' tokenizer: byte-level BPE trained on ``TRAINING_TEXT`` (400 ids, the
    ChatML specials among them), with ``chat_template`` (in a template that uses them, ``<think>``
    and ``</think>`` are tokens of their own). Builds in milliseconds, with no model."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    if "<think>" in chat_template:
        tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", chat_template=chat_template
    )


def build_tiny_model(
    path: Path, seed: int = 0, family: str = "llama", chat_template: str = CHATML, **config_changes: Any
) -> Path:
    """Write a randomly initialised 2-layer model of ``family`` (``FAMILIES``) and a small
    byte-level BPE tokenizer with ``chat_template`` (ChatML; in a template that uses them,
    ``<think>`` and ``</think>`` are tokens of their own) to ``path`` (a Hugging Face checkpoint
    directory); ``config_changes`` override the configuration."""
    tokenizer = tiny_tokenizer(chat_template)
    config_class, model_class, family_config = FAMILIES[family]
    shape = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "pad_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": False,
    }
    config = config_class(**(shape | family_config | config_changes))
    torch.manual_seed(seed)
    model = model_class(config)
    # NOTE: random init gives nearly uniform logits; scaling the output layer makes greedy
    # choices decisive, so token-for-token comparisons mean something.
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


SOURCE_KINDS = {
    "attn_q": "Q4_1",
    "attn_k": "Q4_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_1",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_0",
    "ffn_down": "Q4_1",
    "token_embd": "Q8_0",
    "output": "Q4_1",
}
"""A tiny source model's GGUF types per tensor: every block type the native step computes on."""


def build_tiny_source_model(path: Path, seed: int = 0) -> Path:
    """A tiny Llama (``build_tiny_model``) whose weights are GGUF block codes: each matrix is
    quantized (``SOURCE_KINDS``), the checkpoint holds the codes de-quantized, and the codes sit
    beside it as ``source.gguf`` (as a converted GGUF model's do): the ``source`` weight format."""
    import gguf
    import numpy as np
    from safetensors.torch import load_file, save_file

    from engine.model.fetch import SOURCE_GGUF

    build_tiny_model(path, seed)
    weights = load_file(path / "model.safetensors")
    names = {
        "model.embed_tokens.weight": "token_embd",
        "lm_head.weight": "output",
        **{
            f"model.layers.{i}.{module}.weight": f"blk.{i}.{gguf_name}"
            for i in range(2)
            for module, gguf_name in (
                ("self_attn.q_proj", "attn_q"),
                ("self_attn.k_proj", "attn_k"),
                ("self_attn.v_proj", "attn_v"),
                ("self_attn.o_proj", "attn_output"),
                ("mlp.gate_proj", "ffn_gate"),
                ("mlp.up_proj", "ffn_up"),
                ("mlp.down_proj", "ffn_down"),
            )
        },
    }
    writer = gguf.GGUFWriter(str(path / SOURCE_GGUF), "llama")
    for name, gguf_name in names.items():
        kind = gguf.GGMLQuantizationType[SOURCE_KINDS[gguf_name.rsplit(".", 1)[-1]]]
        codes = gguf.quants.quantize(weights[name].numpy(), kind)
        weights[name] = torch.from_numpy(gguf.quants.dequantize(codes, kind).astype(np.float32))
        writer.add_tensor(f"{gguf_name}.weight", codes, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def engine_events(engine: Engine, request: GenerationRequest) -> list[Event]:
    """Every event of ``request``, computed through the engine's threads, up to its end."""
    arrived: queue.Queue[Event] = queue.Queue()
    engine.submit(request, arrived.put)
    events = [arrived.get(timeout=120)]
    while not isinstance(events[-1], Finished | Failed):
        events.append(arrived.get(timeout=120))
    return events


def run_engine(
    engine: Engine, prompt: tuple[int, ...], max_tokens: int = 12, sampling: SamplingParams = GREEDY
) -> tuple[list[int], int, str]:
    """Generate through the engine's threads: (token ids, cached tokens, finish reason)."""
    events = engine_events(engine, GenerationRequest(prompt, max_tokens, sampling))
    done = next(e for e in events if isinstance(e, PrefillDone))
    finished = next(e for e in events if isinstance(e, Finished))
    return (
        [e.token_id for e in events if isinstance(e, TokenDelta)],
        done.cached_tokens,
        finished.finish_reason,
    )


def prefill_prompt(engine: Engine, prompt: tuple[int, ...]) -> tuple[torch.Tensor, int, int]:
    """The lookup stage and the prefill, on this thread: (last-position logits, cached tokens,
    positions in the past afterwards)."""
    buffers = engine.buffers.acquire(len(prompt))
    prefix = load_prefix(engine.cache, engine.loaded.namespace("default"), prompt, buffers)
    logits = prefill(engine.loaded.model, prompt[prefix.cached_tokens :], prefix.past, prefix.cached_tokens)
    return logits, prefix.cached_tokens, prefix.past.get_seq_length()


def _cpu_has(*features: str) -> bool:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(line for line in lines if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return all(f in flags for f in features)


KERNEL_PATHS = ["native", *(["avx2"] if _cpu_has("avx512f", "avx2", "fma") else [])]
"""The native step's code paths this machine can test: its own (``-march=native``), and on an
AVX-512 CPU the AVX2 path too (built with ``-mno-avx512f``: the path of CPUs without AVX-512)."""


def on_kernel_path(loaded, path: str, cache_dir: Path):
    """``loaded`` with the native step of ``path`` (``KERNEL_PATHS``), built into ``cache_dir``."""
    if path == "native":
        return loaded
    return dataclasses.replace(loaded, kernels=load_kernels(cache_dir, ["-mno-avx512f"]))


def native_greedy_logits(
    loaded, threads: list[int], prompts: list[list[int]], steps: int, unit_bytes: int | None = None
) -> torch.Tensor:
    """The logits ``[steps, len(prompts), vocab]`` of ``steps`` greedy decode steps of the prompts,
    batched, by the native step (``engine.kernels.native``) in units of ``unit_bytes`` (its default
    when None); step i on ``threads[i % len(threads)]`` threads."""
    decoder = NativeDecoder(loaded.model, loaded.codes, loaded.kernels, threads[0], unit_bytes)
    spec = loaded.kv_spec
    pool = BufferPool(torch.empty(spec.num_layers, spec.num_kv_heads, 0, spec.head_dim), keep=0)
    pasts = [past_from_blocks([], 0, pool.acquire(len(p) + steps), loaded.kernels) for p in prompts]
    with torch.inference_mode():
        for prompt, past in zip(prompts, pasts, strict=True):
            prefill(loaded.model, prompt, past, 0)
    tokens, out = [5] * len(prompts), []
    for i in range(steps):
        decoder.threads = threads[i % len(threads)]
        logits = decoder(tokens, pasts, [len(p) + i for p in prompts])
        out.append(logits.clone())
        tokens = [int(t) for t in logits.argmax(-1)]
    return torch.stack(out)


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A process spinning meanwhile (a noisy neighbour): threads are descheduled now and then."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def wait_for(condition: Callable[[], Any], timeout_s: float = HANG_S, what: str = "the condition") -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout_s`` passes
    (then fail naming ``what``). NOTE: tests wait for what they need, never for a fixed time: a
    loaded machine only makes them wait longer; the timeout is a bound on a hang, not a speed."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """A real uvicorn server on a free port, in a thread of the test process."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        settings = app.state.settings.model_copy(update={"host": "127.0.0.1", "port": self.port})
        self.server = uvicorn.Server(server_config(app, settings, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + HANG_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_S)


def redis_server_binary() -> str:
    """The Redis-protocol server the tests start: ``KVPROXY_TEST_REDIS_SERVER`` (``redis-server``,
    for ``.ci/run``'s pass on a real Redis 7), else the embedded index's ``valkey-server``."""
    return os.environ.get("KVPROXY_TEST_REDIS_SERVER") or str(valkey_binary())


class RedisServer:
    """A private Redis-protocol server (``redis_server_binary``) on a given port, for tests that
    must stop or start Redis; it dies with the test process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + HANG_S
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(HANG_S)
            self.process = None


def stored_tensors(data: bytes, spec: KVSpec = SPEC) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """An exact block's (or tail's) blob of ``spec`` read without verification: its metadata, and
    ``key``, ``value`` and ``token_ids`` unpacked."""
    from store.blob_view import array, parse

    metadata, entries, body = parse(data)
    tokens = entries["token_ids"]["shape"][0]
    layers, heads, _, dim = spec.block_shape
    shape, packed = (layers, heads, tokens, dim), metadata.get("blob_version") == "2"
    tensors = {"token_ids": array(entries["token_ids"], body, (tokens,), torch.int64, packed=False)}
    for name in ("key", "value"):
        tensors[name] = array(entries[name], body, shape, spec.torch_dtype, packed=packed)
    return metadata, tensors


def as_version_1(data: bytes, spec: KVSpec = SPEC) -> bytes:
    """An exact block's (or tail's) blob of ``spec`` as kvproxy wrote it before block formats
    (blob version 1: ``key`` and ``value`` unpacked, no ``blob_version``, ``block_format`` or
    ``codec``): the same block, the same checksum."""
    from safetensors.torch import save

    metadata, tensors = stored_tensors(data, spec)
    assert metadata.pop("blob_version") == "2" and metadata.pop("block_format") == "exact", metadata
    del metadata["codec"]
    return save(tensors, metadata=metadata)
