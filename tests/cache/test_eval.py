"""`python -m cache eval`: reading pair files, scoring a sweep, the CLI's JSON."""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cache.cli import app
from cache.errors import PairsFormatError
from cache.training.eval import Pairs, load_pairs, run_eval

LABELLED = [
    {"text_a": "How do I turn on the lights?", "text_b": "How can I switch on the lights?", "label": 1},
    {"text_a": "How do I turn on the lights?", "text_b": "How do I turn off the lights?", "label": 0},
    {"text_a": "What is the capital of France?", "text_b": "Which city is the capital of France?", "label": 1},
    {"text_a": "Best pizza in Rome?", "text_b": "How to fix a bike chain?", "label": 0},
]


def test_reads_json_tar_and_positive_only_files(tmp_path: Path) -> None:
    plain = tmp_path / "pairs.json"
    plain.write_text(json.dumps(LABELLED))
    assert load_pairs(plain).labels == [1, 0, 1, 0]
    archive = tmp_path / "pairs.json.gz"  # a tar despite the name, as GPTCache ships QQP
    with tarfile.open(archive, "w:gz") as tar:
        data = json.dumps(LABELLED).encode()
        info = tarfile.TarInfo("examples/benchmark/pairs.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert load_pairs(archive).text_b == [p["text_b"] for p in LABELLED]
    positives = tmp_path / "mock.json"
    positives.write_text(json.dumps([{"origin": "a b", "similar": "b a"}]))
    assert load_pairs(positives) == Pairs(["a b"], ["b a"], None)
    assert len(load_pairs(plain, sample=2, seed=1).text_a) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"text_a": "x", "text_b": 3, "label": 1}]', "item 0: field 'text_b'"),
        ('[{"text_a": "x", "text_b": "y", "label": 2}]', "item 0: field 'label'"),
        ('{"text_a": "x"}', "non-empty JSON list"),
        ('[{"text_a": "x",\n "text_b": }]', "line 2"),
    ],
)
def test_bad_files_name_the_item_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PairsFormatError, match=message):
        load_pairs(path)


def fake_encode(texts: list[str]) -> np.ndarray:
    """Non-negative unit vectors (every similarity >= 0): same first word -> similar."""
    out = []
    for text in texts:
        v = np.full(4, 0.1, dtype=np.float32)
        v[zlib.crc32(text.split()[0].encode()) % 4] = 1.0
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


def test_sweep_counts_hits_with_and_without_verification() -> None:
    pairs = load_pairs_from(LABELLED)
    report = run_eval(pairs, fake_encode, default_threshold=0.5, extra_threshold=0.0)
    at_zero = next(p for p in report["sweep_without_verification"] if p["threshold"] == 0.0)
    assert at_zero["hit_rate"] == 1.0 and at_zero["recall"] == 1.0 and at_zero["precision"] == 0.5
    verified = report["requested"]
    # verification rejects the on/off pair, so precision rises with the same recall
    assert verified["threshold"] == 0.0 and verified["recall"] == 1.0 and verified["precision"] == pytest.approx(0.6667)
    assert {"threshold", "precision", "recall", "f1"} <= set(report["default"])
    assert report["embeddings_per_s"] > 0


def test_positive_only_pairs_are_scored_as_a_cache() -> None:
    pairs = Pairs(["apple pie recipe", "bike repair shop"], ["apple pie recipes", "bike repair shops"], None)
    report = run_eval(pairs, fake_encode, default_threshold=0.5)
    assert report["kind"] == "positives-only"
    assert report["default"]["correct"] + report["default"]["wrong"] + report["default"]["miss"] == 2


def load_pairs_from(items: list[dict]) -> Pairs:
    return Pairs([p["text_a"] for p in items], [p["text_b"] for p in items], [p["label"] for p in items])


@pytest.mark.slow
def test_cli_writes_the_report(tmp_path: Path, encoder: object) -> None:
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(LABELLED))
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["eval", "--pairs", str(path), "--threshold", "0", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {"sweep", "default", "embeddings_per_s"} <= set(report)
    assert set(report["sweep"][0]) >= {"threshold", "precision", "recall", "f1", "hit_rate"}
    assert report["requested"]["threshold"] == 0.0
    bad = CliRunner().invoke(app, ["eval", "--pairs", str(tmp_path / "missing.json")])
    assert bad.exit_code == 2 and "missing.json" in bad.output  # bad input exits 2 like every CLI
