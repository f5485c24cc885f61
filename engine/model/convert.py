"""Convert a GGUF file into a Hugging Face checkpoint directory (float32 weights, config,
tokenizer with its chat template), once per file. Runs as ``python -m engine.model.convert GGUF
TARGET`` too (``engine.model.fetch.convert_in_child``), so a process that must not import torch
(the router) can have it done.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from engine.model.fetch import SOURCE_GGUF, ModelError, console


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """De-quantize a GGUF file into a float32 Hugging Face checkpoint at ``target``.

    Writes config.json (without ``quantization_config``), model.safetensors, generation_config.json,
    the tokenizer files (with its chat template) and a copy of the GGUF file (``SOURCE_GGUF``).
    About 20-40 s for a 135M model on 2 cores.
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
        shutil.copyfile(gguf_path, tmp / SOURCE_GGUF)  # NOTE: its codes are the source weight format
        # NOTE: mkdtemp makes the directory private; a converted model is ordinary data.
        for path in [tmp, *tmp.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"[bold]kvproxy:[/] model ready in {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m engine.model.convert GGUF_FILE TARGET_DIR")
    try:
        convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
    except ModelError as exc:
        console.print(f"[bold red]kvproxy:[/] {exc}")
        sys.exit(1)
