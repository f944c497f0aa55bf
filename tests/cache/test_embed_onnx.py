"""The ONNX Runtime encoder: same vectors as torch, a disk cache that is reused and repaired, and
the torch fallback for models it cannot run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import cache.embed.onnx as embed_onnx
from cache.embed.encoder import SentenceTransformerEncoder
from cache.embed.load import load_encoder
from cache.embed.onnx import PROBE_TEXTS, OnnxEncoder, length_groups, load_onnx_encoder, mean_pool, onnx_support
from cache.errors import EmbeddingError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(torch_encoder: SentenceTransformerEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real export into a fresh cache dir; the other tests reuse its bytes."""
    directory = tmp_path_factory.mktemp("onnx")
    reference = torch_encoder.encode(PROBE_TEXTS)
    encoder, did_export = load_onnx_encoder(torch_encoder._model, reference, directory)
    assert did_export and isinstance(encoder, OnnxEncoder)
    (path,) = directory.glob("*.onnx")
    return path


def test_the_default_model_runs_on_onnx_with_torchs_vectors(
    encoder: object, torch_encoder: SentenceTransformerEncoder, data_dir: Path
) -> None:
    assert encoder.backend == "onnx"  # the default ("auto") picks ONNX for MiniLM
    pairs = json.loads((data_dir / "cache-eval" / "gptcache-paraphrases" / "mock_data.json").read_text())
    texts = [p["similar"] for p in pairs[:48]] + [p["origin"] for p in pairs[-16:]]
    texts += ["", "ok", "word " * 400]  # empty, one token, truncated at max_seq_length
    onnx_vectors = encoder.encode(texts)  # type: ignore[attr-defined]
    torch_vectors = torch_encoder.encode(texts)
    assert onnx_vectors.shape == torch_vectors.shape == (len(texts), 384)
    assert onnx_vectors.dtype == np.float32
    cosines = (onnx_vectors * torch_vectors).sum(axis=1)
    assert np.abs(cosines - 1).max() < 1e-5
    # a text's vector does not depend on the batch it was padded in
    alone = np.concatenate([encoder.encode([t]) for t in texts[:8]])  # type: ignore[attr-defined]
    assert np.abs((alone * onnx_vectors[:8]).sum(axis=1) - 1).max() < 1e-5


def _counting_exporter(monkeypatch: pytest.MonkeyPatch, data: bytes) -> list[int]:
    calls: list[int] = []

    def export(auto_model: object, input_names: object) -> bytes:
        calls.append(1)
        return data

    monkeypatch.setattr(embed_onnx, "export_transformer", export)
    return calls


def test_a_cached_export_is_reused(
    exported: Path, torch_encoder: SentenceTransformerEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting_exporter(monkeypatch, exported.read_bytes())
    reference = torch_encoder.encode(PROBE_TEXTS)
    _, did_export = load_onnx_encoder(torch_encoder._model, reference, exported.parent)
    assert not did_export and calls == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_corrupt_cache_file_is_exported_again(
    damage: str,
    exported: Path,
    tmp_path: Path,
    torch_encoder: SentenceTransformerEncoder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = exported.read_bytes()
    calls = _counting_exporter(monkeypatch, good)
    path = tmp_path / exported.name
    # written with its own digest (write_onnx), so loading and the probe texts are what catch it
    embed_onnx.write_onnx(
        path, {"garbage": b"not an onnx model", "truncated": good[: len(good) // 2], "empty": b""}[damage]
    )
    reference = torch_encoder.encode(PROBE_TEXTS)
    encoder, did_export = load_onnx_encoder(torch_encoder._model, reference, tmp_path)
    assert did_export and calls == [1]
    assert path.read_bytes() == good  # replaced, and no temporary file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [exported.name, exported.name + ".sha256"]
    assert np.abs((encoder.encode(PROBE_TEXTS) * reference).sum(axis=1) - 1).max() < 1e-5


def test_an_unwritable_cache_dir_still_runs_onnx(
    exported: Path, tmp_path: Path, torch_encoder: SentenceTransformerEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    _counting_exporter(monkeypatch, exported.read_bytes())
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache dir cannot be created under a file")
    encoder, did_export = load_onnx_encoder(torch_encoder._model, torch_encoder.encode(PROBE_TEXTS), blocker / "onnx")
    assert did_export and encoder.encode(["still works"]).shape == (1, 384)


def test_an_export_with_other_vectors_is_refused(
    exported: Path, torch_encoder: SentenceTransformerEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _counting_exporter(monkeypatch, exported.read_bytes())
    wrong = -torch_encoder.encode(PROBE_TEXTS)  # as if the exported graph computed something else
    with pytest.raises(EmbeddingError, match="other vectors"):
        load_onnx_encoder(torch_encoder._model, wrong, tmp_path)
    assert not list(tmp_path.glob("*.onnx"))  # never cached


def test_an_unsupported_pooling_falls_back_to_torch(
    torch_encoder: SentenceTransformerEncoder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    st = torch_encoder._model
    cls_model = SentenceTransformer(modules=[st[0], Pooling(384, pooling_mode="cls"), Normalize()], device="cpu")
    assert "pooling mode 'cls'" in (onnx_support(cls_model) or "")
    cls_model.save(str(tmp_path / "cls-model"))
    with caplog.at_level(logging.WARNING, logger="promptedge.cache.embed"):
        first = load_encoder(str(tmp_path / "cls-model"), backend="auto", cache_dir=tmp_path / "onnx")
        second = load_encoder(str(tmp_path / "cls-model"), backend="auto", cache_dir=tmp_path / "onnx")
    assert isinstance(first, SentenceTransformerEncoder) and first.backend == "torch"
    assert isinstance(second, SentenceTransformerEncoder)
    reasons = [r.getMessage() for r in caplog.records if "runs on torch" in r.getMessage()]
    assert len(reasons) == 1 and "pooling mode 'cls'" in reasons[0]  # logged once
    with pytest.raises(EmbeddingError, match="cannot run on ONNX Runtime"):
        load_encoder(str(tmp_path / "cls-model"), backend="onnx", cache_dir=tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_length_groups_pad_similar_lengths_together() -> None:
    lengths = [30, 12, 250, 14, 31, 13, 90, 29]
    groups = length_groups(lengths, max_texts=3, max_tokens=256)
    assert groups == [[1, 5, 3], [7, 0, 4], [6], [2]]
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert length_groups([]) == []


def test_mean_pool_ignores_padding() -> None:
    hidden = np.array(
        [[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 5.0], [7.0, 9.0], [9.0, 1.0]]], dtype=np.float32
    )
    pooled = mean_pool(hidden, np.array([2, 3]))
    assert pooled.dtype == np.float32
    assert np.allclose(pooled, [[2.0, 3.0], [7.0, 5.0]])
