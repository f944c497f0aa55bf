"""The int8 encoder (``PROMPTEDGE_CACHE_EMBED_PRECISION=int8``, issue 34 item 5): its vectors stay
within int8's tolerance of fp32's, its export is cached under a name of its own and repaired
when stale or damaged, it runs from its manifest without torch's help, and the setting is what
selects it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import cache.embed.onnx as embed_onnx
import cache.semantic.cache as semantic_cache
from cache.embed.bundle import load_bundle
from cache.embed.encoder import SentenceTransformerEncoder
from cache.embed.load import load_encoder
from cache.embed.onnx import (
    INT8_PROBE_MIN_COSINE,
    PROBE_TEXTS,
    OnnxEncoder,
    load_onnx_encoder,
    model_digest,
    onnx_file_name,
)
from cache.errors import EmbeddingError
from cache.settings import CacheSettings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def int8_dir(torch_encoder: SentenceTransformerEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real int8 export (export + quantization) into a fresh cache dir, through load_encoder."""
    directory = tmp_path_factory.mktemp("onnx-int8")
    encoder = load_encoder(cache_dir=directory, precision="int8")
    assert isinstance(encoder, OnnxEncoder) and encoder.backend == "onnx-int8"
    return directory


def _int8_file(directory: Path) -> Path:
    (path,) = directory.glob("*-int8.onnx")
    return path


def test_int8_vectors_are_within_tolerance_of_fp32(
    int8_dir: Path, torch_encoder: SentenceTransformerEncoder, data_dir: Path
) -> None:
    encoder = load_encoder(cache_dir=int8_dir, precision="int8")
    assert encoder.backend == "onnx-int8"  # type: ignore[attr-defined]
    pairs = json.loads((data_dir / "cache-eval" / "gptcache-paraphrases" / "mock_data.json").read_text())
    prompts = [p["similar"] for p in pairs[:40]]
    int8, fp32 = encoder.encode(prompts), torch_encoder.encode(prompts)
    assert int8.dtype == np.float32 and int8.shape == fp32.shape == (40, 384)
    cosines = (int8 * fp32).sum(axis=1)
    assert cosines.min() > 0.98  # typical prompts: measured >= 0.989
    assert cosines.max() < 1 - 1e-4  # really quantized, not the fp32 file under another name
    probe = (encoder.encode(PROBE_TEXTS) * torch_encoder.encode(PROBE_TEXTS)).sum(axis=1)
    assert probe.min() >= INT8_PROBE_MIN_COSINE
    # the pair similarities the cache decides on move little
    origins = [p["origin"] for p in pairs[:40]]
    shift = (encoder.encode(origins) * int8).sum(axis=1) - (torch_encoder.encode(origins) * fp32).sum(axis=1)
    assert np.abs(shift).max() < 0.05


def test_the_int8_file_has_its_own_name_and_digest(int8_dir: Path, torch_encoder: SentenceTransformerEncoder) -> None:
    auto_model = torch_encoder._model[0].auto_model  # type: ignore[index]
    fp32_digest, int8_digest = model_digest(auto_model), model_digest(auto_model, "int8")
    assert fp32_digest != int8_digest
    assert onnx_file_name(auto_model) == f"{fp32_digest}.onnx"  # the name fp32 files always had
    assert _int8_file(int8_dir).name == onnx_file_name(auto_model, "int8") == f"{int8_digest}-int8.onnx"
    assert not (int8_dir / f"{fp32_digest}.onnx").exists()  # an int8 load writes no fp32 file
    fp32 = load_encoder(cache_dir=int8_dir)  # and an fp32 load never picks the int8 file up
    assert fp32.backend == "onnx"  # type: ignore[attr-defined]
    probe = fp32.encode(PROBE_TEXTS) * torch_encoder.encode(PROBE_TEXTS)
    assert np.abs(probe.sum(axis=1) - 1).max() < 1e-5


def _other_vectors(model_bytes: bytes) -> bytes:
    """A valid model that computes something else: the last LayerNorm's gain reversed."""
    model = onnx.load_from_string(model_bytes)
    (gain,) = [i for i in model.graph.initializer if "layer.5.output.LayerNorm.weight" in i.name]
    values = onnx.numpy_helper.to_array(gain)
    gain.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(values[::-1]), gain.name))
    return model.SerializeToString()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stale"])
def test_a_damaged_or_stale_int8_file_is_exported_again(
    damage: str,
    int8_dir: Path,
    tmp_path: Path,
    torch_encoder: SentenceTransformerEncoder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = _int8_file(int8_dir).read_bytes()
    real_export = embed_onnx.export_transformer
    calls: list[int] = []

    def counting_export(auto_model: object, input_names: list[str]) -> bytes:
        calls.append(1)
        return real_export(auto_model, input_names)

    monkeypatch.setattr(embed_onnx, "export_transformer", counting_export)
    path = tmp_path / _int8_file(int8_dir).name
    # written with its own digest (write_onnx), so loading and the probe texts are what catch it
    embed_onnx.write_onnx(
        path,
        {"garbage": b"not an onnx model", "truncated": good[: len(good) // 2], "stale": _other_vectors(good)}[damage],
    )
    reference = torch_encoder.encode(PROBE_TEXTS)
    if damage == "stale":  # the damage is real: this file's vectors are far from fp32's
        stale = OnnxEncoder(
            embed_onnx._session(path.read_bytes(), 1),
            torch_encoder._model[0].tokenizer,  # type: ignore[index]
            ["input_ids", "attention_mask", "token_type_ids"],
            256,
            384,
        )
        assert (stale.encode(PROBE_TEXTS) * reference).sum(axis=1).min() < INT8_PROBE_MIN_COSINE
    encoder, did_export = load_onnx_encoder(torch_encoder._model, reference, tmp_path, precision="int8")
    assert did_export and calls == [1]
    assert encoder.backend == "onnx-int8"
    assert (encoder.encode(PROBE_TEXTS) * reference).sum(axis=1).min() >= INT8_PROBE_MIN_COSINE
    # replaced in place with its digest, no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".sha256"]
    _, again = load_onnx_encoder(torch_encoder._model, reference, tmp_path, precision="int8")
    assert not again  # the repaired file is reused


def test_the_int8_manifest_serves_int8_and_the_fp32_one_fp32(
    int8_dir: Path, torch_encoder: SentenceTransformerEncoder
) -> None:
    # the torch-free path (the router image): int8's own manifest, held to int8's tolerance
    bundled = load_bundle(None, int8_dir, precision="int8")
    assert bundled is not None and bundled.backend == "onnx-int8"
    assert (bundled.encode(PROBE_TEXTS) * torch_encoder.encode(PROBE_TEXTS)).sum(axis=1).min() >= INT8_PROBE_MIN_COSINE
    assert (int8_dir / "default-model-int8.json").is_file()
    manifest = json.loads((int8_dir / "default-model-int8.json").read_text())
    assert manifest["precision"] == "int8" and manifest["onnx"] == _int8_file(int8_dir).name
    # an fp32 manifest written later sits beside it; neither is mistaken for the other
    load_encoder(cache_dir=int8_dir)
    fp32 = load_bundle(None, int8_dir)
    assert fp32 is not None and fp32.backend == "onnx"
    assert load_bundle(None, int8_dir, precision="int8").backend == "onnx-int8"  # type: ignore[union-attr]


def test_a_manifest_of_another_precision_is_a_miss(int8_dir: Path, tmp_path: Path) -> None:
    for path in int8_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    # int8 manifests under the fp32 names (a copy gone wrong) must not serve as fp32
    for manifest in tmp_path.glob("*-int8.json"):
        (tmp_path / manifest.name.replace("-int8.json", ".json")).write_bytes(manifest.read_bytes())
    assert load_bundle(None, tmp_path) is None
    assert load_bundle(None, tmp_path, precision="int8") is not None


def test_the_setting_selects_the_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBED_PRECISION", "int8")
    assert CacheSettings().embed_precision == "int8"
    monkeypatch.delenv("PROMPTEDGE_CACHE_EMBED_PRECISION")
    assert CacheSettings().embed_precision == "fp32"  # the default
    with pytest.raises(ValueError):
        CacheSettings(embed_precision="int4")  # type: ignore[arg-type]
    with pytest.raises(EmbeddingError, match="ONNX Runtime only"):
        load_encoder(backend="torch", precision="int8")


def test_int8_on_torch_is_refused_by_the_settings_naming_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: accepted, and the semantic stage was off only once the encoder loaded
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBED_PRECISION", "int8")
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBED_BACKEND", "torch")
    with pytest.raises(ValueError, match="PROMPTEDGE_CACHE_EMBED_PRECISION=int8.*PROMPTEDGE_CACHE_EMBED_BACKEND=torch"):
        CacheSettings()
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBED_BACKEND", "onnx")
    assert CacheSettings().embed_precision == "int8"
    with pytest.raises(EmbeddingError, match="unknown embedding precision"):
        load_encoder(precision="fp16")


async def test_the_semantic_cache_loads_the_configured_precision(
    monkeypatch: pytest.MonkeyPatch, int8_dir: Path, redis_url: str
) -> None:
    import redis.asyncio as aioredis

    from cache import ResponseCache

    asked: list[tuple[object, ...]] = []
    real = semantic_cache.shared_encoder

    def spy(*args: object) -> object:
        asked.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(semantic_cache, "shared_encoder", spy)
    client = aioredis.Redis.from_url(redis_url)
    settings = CacheSettings(embed_precision="int8", onnx_cache_dir=int8_dir, key_prefix="test:int8")
    cache = ResponseCache(client, settings)
    try:
        await cache.start()
        assert cache.semantic is not None and cache.semantic.embedder is not None
        assert cache.semantic.embedder.encoder.backend == "onnx-int8"  # type: ignore[attr-defined]
        assert asked and asked[0][-1] == "int8"
    finally:
        await cache.aclose()
        await client.aclose()
