"""An exported ONNX file is used only when its bytes match the content digest recorded when it
was written (cache/embed/onnx.py ``write_onnx``/``read_onnx``, the manifest's ``onnx_sha256``), and
no encoder lets a NaN or inf vector out.

From the issue 34 adversarial round: a cached int8 file with 2 MB of its weights overwritten (its
size and protobuf structure intact) loaded again and passed the probe texts, then gave NaN or
unrelated vectors (cosine ~0.1 to torch's) for other words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cache.embed.encoder import check_finite
from cache.embed.load import load_encoder
from cache.embed.onnx import OnnxEncoder
from cache.errors import EmbeddingError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORDS = (
    '""though"" ""ah"" ""illegal"" ""red"" ""blue"" ""grey"" ""seen"" ""stuck"" ""will"" ""Gemini"" '
    "the cat sat on the mat how do i reset my password what is the capital of france"
).split()
# as in an install of promptedge[router] (tests/cache/test_embed_bundle.py): these are not there
_NO_TORCH = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "sentence_transformers", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
        return None
sys.meta_path.insert(0, _Absent())
"""


def _corrupt(path: Path) -> None:
    """Overwrite 2 MB in the middle of the weights with random bytes, as the attack did."""
    data = bytearray(path.read_bytes())
    data[20_000_000:22_000_000] = np.random.default_rng(1).integers(0, 256, 2_000_000, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def _load_without_torch(cache_dir: Path, precision: str, tmp_path: Path) -> str:
    """What load_encoder raises (its message) in a process without torch; fails if it loads."""
    script = tmp_path / "no_torch.py"
    script.write_text(
        _NO_TORCH
        + textwrap.dedent(
            f"""
            from cache.embed.load import load_encoder
            from cache.errors import EmbeddingError
            try:
                load_encoder(cache_dir={str(cache_dir)!r}, precision={precision!r})
            except EmbeddingError as exc:
                print(exc)
            else:
                raise SystemExit("loaded")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def int8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An int8 export with its torch-free manifest (as ``export-onnx --precision int8`` writes)."""
    directory = tmp_path_factory.mktemp("onnx-int8")
    load_encoder(None, precision="int8", cache_dir=directory)
    return directory


def _copy(source: Path, target: Path) -> Path:
    target.mkdir(exist_ok=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_a_corrupt_cached_int8_file_is_exported_again(int8_dir: Path, tmp_path: Path) -> None:
    directory = _copy(int8_dir, tmp_path / "onnx")
    (onnx_file,) = directory.glob("*-int8.onnx")
    _corrupt(onnx_file)

    reloaded = load_encoder(None, precision="int8", cache_dir=directory)
    torch_vectors = np.asarray(load_encoder(None, backend="torch").encode(WORDS))
    vectors = np.asarray(reloaded.encode(WORDS))
    cosines = (vectors * torch_vectors).sum(axis=1)
    assert not np.isnan(vectors).any(), f"NaN vectors for {[w for w, c in zip(WORDS, cosines) if np.isnan(c)]}"
    assert cosines.min() >= 0.9, dict(zip(WORDS, np.round(cosines, 3)))


def test_without_torch_a_corrupt_file_is_refused_naming_it_and_the_export(int8_dir: Path, tmp_path: Path) -> None:
    directory = _copy(int8_dir, tmp_path / "onnx")
    (onnx_file,) = directory.glob("*-int8.onnx")
    _corrupt(onnx_file)
    message = _load_without_torch(directory, "int8", tmp_path)
    assert onnx_file.name in message and "damaged" in message
    assert "python -m cache export-onnx --precision int8" in message


def test_a_manifest_without_a_digest_is_not_used(int8_dir: Path, tmp_path: Path) -> None:
    directory = _copy(int8_dir, tmp_path / "onnx")
    manifests = [p for p in directory.glob("*-int8.json")]  # by source digest, and default-model-int8.json
    assert len(manifests) == 2
    for manifest_path in manifests:
        manifest = json.loads(manifest_path.read_text())
        del manifest["onnx_sha256"]  # as written before digests
        manifest_path.write_text(json.dumps(manifest))
    message = _load_without_torch(directory, "int8", tmp_path)
    assert "no content digest" in message and manifest["onnx"] in message
    # where torch is installed, the next load exports again and records the digest
    assert load_encoder(None, precision="int8", cache_dir=directory).backend == "onnx-int8"  # type: ignore[attr-defined]
    assert json.loads(manifest_path.read_text())["onnx_sha256"]


def test_without_an_int8_export_the_error_names_the_int8_export(tmp_path: Path) -> None:
    message = _load_without_torch(tmp_path / "empty", "int8", tmp_path)
    assert "python -m cache export-onnx --precision int8" in message


class _NanSession:
    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids = feed["input_ids"]
        hidden = np.ones((*ids.shape, 4), dtype=np.float32)
        hidden[0, 0, 0] = np.nan  # one damaged weight spreads NaN through a row
        return [hidden]


class _Tokenizer:
    pad_token_id = 0

    def __call__(self, texts: list[str], **_options: object) -> dict[str, list[list[int]]]:
        return {"input_ids": [[1, 2] for _ in texts]}


def test_a_nan_vector_never_leaves_the_onnx_encoder() -> None:
    encoder = OnnxEncoder(_NanSession(), _Tokenizer(), ["input_ids"], 8, 4)
    with pytest.raises(EmbeddingError, match="non-finite"):
        encoder.encode(["a", "b"])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_check_finite_refuses_nan_and_inf(bad: float) -> None:
    vectors = np.ones((3, 4), dtype=np.float32)
    assert check_finite(vectors, "test") is vectors
    vectors[1, 2] = bad
    with pytest.raises(EmbeddingError, match="1 non-finite"):
        check_finite(vectors, "test")
