"""An embedding-model setting that cannot be loaded leaves the semantic stage "failed" and the
exact cache serving; it never stops the router's start, and its reason, shown by the log,
``/cache/stats`` and ``/health``, holds no secret the setting carried.

Attack rounds on /health's ``semantic_error``: a partly downloaded ``model.safetensors`` raised
safetensors' own error type (not an OSError) out of the router's start, and so did a path too
long for the file system and a model that loads but cannot encode (a tokenizer id past the
vocabulary, a wrong pooling dimension, a text where a number belongs) and an ONNX manifest
that is no JSON object or nested past the parser's depth; a token in the setting (a URL's user
information, a query, a fragment, with a line break or without a scheme) was shown verbatim,
by the router and by ``python -m cache``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache import CacheSettings, ResponseCache
from cache.embed.bundle import load_bundle, manifest_name, source_digest
from cache.embed.encoder import default_model_path
from opskit import JsonFormatter
from tests.cache.helpers import answer, ask

SECRET = "hf_SECRETTOKEN123"


def _minilm_with(folder: Path, name: str, content: bytes | str) -> Path:
    """The bundled MiniLM's files linked into ``folder``, its file ``name`` replaced by ``content``."""
    source = default_model_path()
    for path in source.rglob("*"):
        if path.is_file():
            target = folder / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.relative_to(source).as_posix() == name:
                target.write_bytes(content if isinstance(content, bytes) else content.encode())
            else:
                target.symlink_to(path)
    return folder


def _edited_json(name: str, edit: Callable[[Any], None]) -> str:
    data = json.loads((default_model_path() / name).read_text())
    edit(data)
    return json.dumps(data)


def _ids_past_vocab() -> str:  # loads, then its first encode indexes past the embedding table
    return _edited_json(
        "tokenizer.json", lambda t: t["post_processor"]["special_tokens"]["[CLS]"].__setitem__("ids", [40000])
    )


def _wrong_pooling_dim() -> str:
    return _edited_json("1_Pooling/config.json", lambda c: c.__setitem__("word_embedding_dimension", 385))


def _pooling_dim_as_text() -> str:  # loads (the text is multiplied, not refused), then int() fails
    return _edited_json("1_Pooling/config.json", lambda c: c.__setitem__("word_embedding_dimension", "abc"))


def _max_len_as_text() -> str:
    return _edited_json("sentence_bert_config.json", lambda c: c.__setitem__("max_seq_length", "256"))


def _truncated_weights() -> bytes:
    with (default_model_path() / "model.safetensors").open("rb") as f:
        return f.read(1 << 20)  # a download cut off after its first MiB


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "random", "model.safetensors", os.urandom(4096))), id="random-weights"
        ),
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "cut", "model.safetensors", _truncated_weights())),
            id="truncated-weights",
        ),
        pytest.param(lambda tmp: str(_minilm_with(tmp / "empty", "model.safetensors", b"")), id="empty-weights"),
        pytest.param(lambda tmp: "/" + "a" * 20_000, id="path-too-long"),
        pytest.param(lambda tmp: f"https://user:{SECRET}@example.com/model", id="url-with-credentials"),
        pytest.param(lambda tmp: f"/srv/models/mini?token={SECRET}", id="query-token"),
        pytest.param(lambda tmp: f"org/model?api_key={SECRET}", id="query-api-key"),
        pytest.param(
            lambda tmp: f"https://user:p@ss{SECRET}@host.example/m?sig={SECRET}&accessToken={SECRET}",
            id="password-with-at-and-any-query",
        ),
        pytest.param(lambda tmp: f"https://hub.example.com/m?token={SECRET}\n", id="query-with-trailing-newline"),
        pytest.param(lambda tmp: f"alice:{SECRET}@example.com/m", id="credentials-without-scheme"),
        pytest.param(lambda tmp: f"https://example.com/m#{SECRET}", id="fragment"),
        pytest.param(lambda tmp: f"https://alice:{SECRET}/x#y@example.com/m", id="raw-password-with-slash-hash"),
        pytest.param(lambda tmp: f"org/m?token=QTOK\\{SECRET}", id="backslash-escaped-by-repr"),
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "dimtext", "1_Pooling/config.json", _pooling_dim_as_text())),
            id="pooling-dim-as-text",
        ),
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "ids", "tokenizer.json", _ids_past_vocab())), id="ids-past-vocab"
        ),
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "dim", "1_Pooling/config.json", _wrong_pooling_dim())),
            id="wrong-pooling-dim",
        ),
        pytest.param(
            lambda tmp: str(_minilm_with(tmp / "len", "sentence_bert_config.json", _max_len_as_text())),
            id="max-length-as-text",
        ),
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


@pytest.mark.parametrize("text", ["[]", '"fp32"', "null", "3", "[" * 100_000 + "]" * 100_000])
def test_an_onnx_manifest_that_is_not_an_object_is_a_miss_not_an_error(text: str, tmp_path: Path) -> None:
    # Attack round: valid JSON that is no object raised AttributeError out of load_bundle (its
    # docstring: never raises), past the start's handling of a damaged export.
    folder = default_model_path()
    (tmp_path / manifest_name(source_digest(folder), "fp32")).write_text(text)
    problems: list[str] = []
    assert load_bundle(None, tmp_path, 1, "fp32", problems) is None


def _cache_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PROMPTEDGE_CACHE_ONNX_CACHE_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-m", "cache", *args], env=environ, capture_output=True, text=True, timeout=300
    )


def test_the_cache_cli_masks_the_credentials_of_a_model_it_cannot_load(tmp_path: Path) -> None:
    # Attack rounds: `python -m cache export-onnx` (run at image build time) printed the model
    # setting's password and token, which only the router had registered; then the libraries'
    # own warnings, which went to stderr without opskit's formatter.
    done = _cache_cli(
        tmp_path, "export-onnx", PROMPTEDGE_CACHE_EMBEDDING_MODEL=f"https://alice:{SECRET}@example.com/m?token={SECRET}"
    )
    assert done.returncode == 1, done.stderr
    assert "error: cannot load embedding model https://***@example.com/m?***" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr
    # a hub-style value: huggingface_hub's warning quotes it
    for model in (f"alice:{SECRET}@example.com/m", f"org/m?token={SECRET}"):
        done = _cache_cli(tmp_path, "export-onnx", "--model", model)
        assert done.returncode == 1 and "error: cannot load embedding model" in done.stderr, done.stderr
        assert SECRET not in done.stdout + done.stderr, done.stderr


def test_a_cache_settings_error_names_the_settings_not_their_values(tmp_path: Path) -> None:
    # Attack round: a rule across fields printed pydantic's text, which quotes every input,
    # the model URL's credentials among them (cut where a registered string no longer matches).
    done = _cache_cli(
        tmp_path,
        "export-onnx",
        PROMPTEDGE_CACHE_EMBEDDING_MODEL=f"https://u:{SECRET}@h/m?token={SECRET}",
        PROMPTEDGE_CACHE_TTL_S="1",
        PROMPTEDGE_CACHE_MIN_TTL_S="100",
    )
    assert done.returncode == 2, done.stderr
    assert "min_ttl_s <= ttl_s" in done.stderr and "input_value" not in done.stderr, done.stderr
    assert SECRET[-6:] not in done.stderr, done.stderr
