"""Key identity: position, model, weights and KV dtype are part of a block's name;
the process is not."""

from __future__ import annotations

import dataclasses
import shutil

from engine.model.loading import load_model
from tests.api import Api
from tests.helpers import build_tiny_model, random_tokens

X, Y, Z = random_tokens(128, seed=1), random_tokens(128, seed=2), random_tokens(128, seed=3)


def test_same_tokens_at_another_position_never_hit(cached) -> None:
    """X+Y cached; Z+X+Y shares X and Y at other positions: zero cached tokens."""
    cached.complete(X + Y + X[:5])
    cached.flush()
    assert cached.complete(Z + X + Y).cached_tokens == 0
    assert cached.complete(X + Y + Z).cached_tokens == 256


def serve_tiny(serve, settings, loaded):
    return serve(settings, dataclasses.replace(loaded, name="tiny"))


def test_other_weights_under_the_same_name_never_reuse(tmp_path, settings, serve) -> None:
    """Same checkpoint path re-written with other weights: zero matches, nothing old read."""
    path = build_tiny_model(tmp_path / "model")
    prompt = random_tokens(300, seed=4)
    with serve_tiny(serve, settings, load_model(str(path), cache_dir=tmp_path)) as server:
        Api(server).complete(prompt)
        Api(server).flush()
        assert Api(server).complete(prompt).cached_tokens == 299  # its blocks and tail

    shutil.rmtree(path)
    build_tiny_model(path, seed=1)
    with serve_tiny(serve, settings, load_model(str(path), cache_dir=tmp_path)) as server:
        api = Api(server)
        assert api.complete(prompt).cached_tokens == 0
        assert api.cache.admin.stats().blocks_matched == 0


def test_other_kv_dtype_never_reuses(tiny_model, settings, serve, tmp_path) -> None:
    """The same model in bfloat16 shares nothing with its float32 blocks."""
    prompt = random_tokens(300, seed=5)
    with serve(settings, tiny_model) as server:
        Api(server).complete(prompt)
        Api(server).flush()
    bf16 = load_model(str(tiny_model.model.name_or_path), cache_dir=tmp_path, dtype="bfloat16")
    with serve_tiny(serve, settings, bf16) as server:
        api = Api(server)
        assert api.complete(prompt).cached_tokens == 0
        assert api.cache.admin.stats().blocks_matched == 0
        api.flush()
        assert api.complete(prompt).cached_tokens == 299  # its own blocks and tail do hit


def test_restart_keeps_every_hit(tiny_model, settings, serve) -> None:
    """A new server process state on the same Redis and blob dir hits every stored block and
    tail: each prompt all but its last token."""
    prompts = [random_tokens(n, seed=n) for n in (130, 260, 520)]
    with serve(settings, tiny_model) as server:
        for p in prompts:
            Api(server).complete(p)
        Api(server).flush()
    with serve(settings, tiny_model) as server:
        assert [Api(server).complete(p).cached_tokens for p in prompts] == [129, 259, 519]
