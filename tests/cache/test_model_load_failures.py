"""An embedding-model setting that cannot be loaded leaves the semantic stage "failed" and the
exact cache serving; it never stops the router's start, and its reason, shown by the log,
``/cache/stats`` and ``/health``, holds no secret the setting carried.

Attack round on /health's ``semantic_error``: a partly downloaded ``model.safetensors`` raised
safetensors' own error type (not an OSError) out of the router's start, and so did a path too
long for the file system; a token in the setting (a URL's user information, a query value) was
shown verbatim."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from cache import CacheSettings, ResponseCache
from cache.embed.encoder import default_model_path
from opskit import JsonFormatter
from tests.cache.helpers import answer, ask

SECRET = "hf_SECRETTOKEN123"


def _minilm_with_weights(folder: Path, weights: bytes) -> Path:
    """The bundled MiniLM's files linked into ``folder``, its ``model.safetensors`` replaced."""
    source = default_model_path()
    for path in source.rglob("*"):
        if path.is_file():
            target = folder / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.name == "model.safetensors":
                target.write_bytes(weights)
            else:
                target.symlink_to(path)
    return folder


def _truncated_weights() -> bytes:
    with (default_model_path() / "model.safetensors").open("rb") as f:
        return f.read(1 << 20)  # a download cut off after its first MiB


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(lambda tmp: str(_minilm_with_weights(tmp / "random", os.urandom(4096))), id="random-weights"),
        pytest.param(lambda tmp: str(_minilm_with_weights(tmp / "cut", _truncated_weights())), id="truncated-weights"),
        pytest.param(lambda tmp: str(_minilm_with_weights(tmp / "empty", b"")), id="empty-weights"),
        pytest.param(lambda tmp: "/" + "a" * 20_000, id="path-too-long"),
        pytest.param(lambda tmp: f"https://user:{SECRET}@example.com/model", id="url-with-credentials"),
        pytest.param(lambda tmp: f"/srv/models/mini?token={SECRET}", id="query-token"),
        pytest.param(lambda tmp: f"org/model?api_key={SECRET}", id="query-api-key"),
    ],
)
async def test_a_model_that_cannot_be_loaded_fails_the_stage_not_the_start(
    setting, tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, embedding_model=setting(tmp_path)))
    try:
        await cache.start()  # raised SafetensorError / OSError(ENAMETOOLONG) before the fix
        assert cache.semantic is not None and cache.semantic.state == "failed"
        reason = cache.semantic.error
        assert reason and "\n" not in reason, reason
        # the libraries log the setting too: what the router's log handler writes is checked
        logged = "\n".join(JsonFormatter().format(r) for r in caplog.records)
        shown = [reason, logged, str(await cache.stats())]
        assert not any(SECRET in text for text in shown), shown
        await cache.store(ask("How do I reset my router?"), answer())
        hit = await cache.lookup(ask("How do I reset my router?"))
        assert hit is not None and hit.kind == "exact"
    finally:
        await cache.aclose()
        await client.aclose()
