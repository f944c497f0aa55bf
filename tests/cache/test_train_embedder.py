"""`python -m cache train-embedder` (cache/training/embedder.py): thresholds from the calibration
split, and a real fine-tune of the bundled model on a few pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cache.cli import app
from cache.training.embedder import THRESHOLDS_FILE, at, precision_at_recall, threshold_for
from cache.training.splits import split_of
from tests.cache.test_multiturn import LABELS, A, B


def test_the_threshold_is_the_lowest_cosine_whose_lower_bound_meets_the_target() -> None:
    sims = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.94] * 50)
    labels = np.array([True, True, True, True, False, False] * 50)
    # above 0.96 every pair is a duplicate: 200 of 200, lower bound 0.987; at 0.95 it is 0.8
    assert threshold_for(sims, labels, 0.95) == pytest.approx(0.96)
    assert threshold_for(sims, labels, 0.999) is None
    row = at(sims, labels, 0.96)
    assert (row["precision"], row["recall"], row["hits"]) == (1.0, 1.0, 200)
    assert precision_at_recall(sims, labels, 0.5) == 1.0  # the 100 most similar: all duplicates
    shuffled = np.array([0.99, 0.985, 0.98, 0.94] * 50)  # positives at 0.99 and 0.98, negatives between
    mixed = np.array([True, False, True, False] * 50)
    assert precision_at_recall(shuffled, mixed, 1.0) == pytest.approx(100 / 150, abs=1e-4)  # 50 negatives come first


@pytest.mark.slow
def test_a_fine_tune_pulls_the_train_duplicates_together_and_writes_a_loadable_folder(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from cache.embed.encoder import default_model_path

    pairs = [{"text_a": a, "text_b": b, "label": y} for a, b, y in zip(A, B, LABELS)] * 4
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(pairs))
    out = tmp_path / "model"
    result = CliRunner().invoke(
        app,
        ["train-embedder", "--pairs", str(path), "--out", str(out), "--epochs", "6", "--batch", "4", "--lr", "1e-4"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / THRESHOLDS_FILE).read_text())
    assert report["steps"] == 18  # 12 train pairs / 4, 6 times
    assert "precision_at_recall_0.4" in report["test"] and "precision_at_recall_0.4" in report["base"]["test"]
    assert "base model: test precision at recall 0.40" in result.output
    train = [(a, b) for a, b, y in zip(A, B, LABELS) if y == 1 and split_of(a, b) == "train"]
    assert train

    def mean_cosine(model: SentenceTransformer) -> float:
        va = model.encode([a for a, _ in train], normalize_embeddings=True)
        vb = model.encode([b for _, b in train], normalize_embeddings=True)
        return float((va * vb).sum(axis=1).mean())

    before = mean_cosine(SentenceTransformer(str(default_model_path()), device="cpu"))
    tuned = SentenceTransformer(str(out), device="cpu")
    after = mean_cosine(tuned)
    # it reads as far as the bundled model: a shorter read would hide differences past the cut
    assert tuned.max_seq_length == SentenceTransformer(str(default_model_path()), device="cpu").max_seq_length
    assert after > before + 0.01, (before, after)
    unlabelled = tmp_path / "mock.json"
    unlabelled.write_text(json.dumps([{"origin": "a", "similar": "b"}]))
    bad = CliRunner().invoke(app, ["train-embedder", "--pairs", str(unlabelled), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "labelled pairs" in bad.output
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = CliRunner().invoke(app, ["train-embedder", "--pairs", str(path), "--out", str(blocked / "model")])
    assert unwritable.exit_code == 2 and "--out" in unwritable.output and "step" not in unwritable.output
