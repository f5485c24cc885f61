"""Shared test machinery: block factories, a tiny model built in-process, a server thread, free
ports, a private Redis. Fixtures built from these live in ``tests/conftest.py``."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis
import torch
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hashing import BLOCK_SIZE, namespace_digest
from store.interface import KVSpec

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
"""A small K/V layout for store tests that need no model."""
NS = namespace_digest(model_fingerprint="m", kv_dtype="float32", tenant="t")


def kv(num_blocks: int, spec: KVSpec = SPEC) -> tuple[torch.Tensor, torch.Tensor]:
    """Random key and value ``[num_layers, num_kv_heads, 128 * num_blocks, head_dim]``."""
    shape = (spec.num_layers, spec.num_kv_heads, BLOCK_SIZE * num_blocks, spec.head_dim)
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

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. A prefix cache stores attention keys and values "
    "so that a prompt which starts like an earlier one is not computed twice.",
    "Blocks of 128 tokens are named by chained hashes; the longest cached prefix is loaded and "
    "only the suffix is prefilled. What is the capital of France? Paris is.",
]


def build_tiny_model(path: Path, seed: int = 0) -> Path:
    """Write a randomly initialised 2-layer Llama and a small byte-level BPE tokenizer with a
    ChatML template to ``path`` (a Hugging Face checkpoint directory)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", chat_template=CHATML
    )
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # NOTE: random init gives nearly uniform logits; scaling the output layer makes greedy
    # choices decisive, so token-for-token comparisons mean something.
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """A real uvicorn server on a free port, in a thread of the test process."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


class RedisServer:
    """A private ``redis-server`` on a given port, for tests that must stop or start Redis."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                "redis-server",
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
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
