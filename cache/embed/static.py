"""A static (Model2Vec-style) sentence encoder in numpy: no transformer, one table look-up per token.

A static model is a tokenizer (``tokenizer.json``) and one vector per token (``model.safetensors``);
a text's vector is the weighted mean of its tokens' vectors, L2-normalised. Files of the layout
Model2Vec writes, optionally vocabulary-quantised:

- ``embeddings``: (rows, dim), any float or int8 dtype (int8 needs no scale: the mean is
  normalised, so a common factor cancels);
- ``mapping`` (optional): token id -> row of ``embeddings`` (vocabulary quantisation: many
  tokens share a row);
- ``weights`` (optional): one factor per token id;
- ``config.json``: ``normalize`` (default true).

Tokens are taken without special tokens (no [CLS]/[SEP]), as Model2Vec does, and a text keeps its
first ``max_tokens`` tokens. Blocking and thread-safe (``tokenizers``' ``encode_batch`` and numpy
release the GIL); loads with ``tokenizers`` and ``safetensors`` only, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cache.errors import EmbeddingError

MAX_TOKENS = 512


class StaticEncoder:
    """Texts -> (len(texts), dim) float32 unit vectors from a static token table. Raises
    EmbeddingError on a tokenizer failure."""

    backend = "static"

    def __init__(
        self,
        tokenizer: object,
        table: np.ndarray,
        mapping: np.ndarray | None,
        weights: np.ndarray | None,
        normalize: bool = True,
        max_tokens: int = MAX_TOKENS,
    ) -> None:
        self._tokenizer = tokenizer
        self._table = table.astype(np.float32)
        self._mapping = mapping
        self._weights = None if weights is None else weights.astype(np.float32)
        self._normalize = normalize
        self._max_tokens = max_tokens
        self.dim = int(table.shape[1])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        try:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - the tokenizers binding raises plain Exception
            raise EmbeddingError(f"static model tokenizer failed: {exc}") from exc
        for i, encoding in enumerate(encodings):
            ids = np.asarray(encoding.ids[: self._max_tokens], dtype=np.int64)
            if ids.size == 0:
                continue  # an empty text: the zero vector (similar to nothing)
            rows = ids if self._mapping is None else self._mapping[ids]
            vectors = self._table[rows]
            if self._weights is not None:
                vectors = vectors * self._weights[ids][:, None]
            out[i] = vectors.mean(axis=0)
        if self._normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def load_static_encoder(folder: Path) -> StaticEncoder:
    """A StaticEncoder of the model files in ``folder`` (see the module doc). Raises EmbeddingError
    naming the file at fault."""
    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise EmbeddingError(f"a static model needs tokenizers and safetensors: {exc}") from exc
    folder = Path(folder)
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tensors = load_file(str(folder / "model.safetensors"))
        config_path = folder / "config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except Exception as exc:  # noqa: BLE001 - tokenizers and safetensors raise plain Exception
        raise EmbeddingError(f"cannot load the static model in {folder}: {exc}") from exc
    table = tensors.get("embeddings")
    if table is None or table.ndim != 2:
        raise EmbeddingError(f"{folder / 'model.safetensors'}: no 2-D 'embeddings' tensor")
    mapping = tensors.get("mapping")
    weights = tensors.get("weights")
    vocab = tokenizer.get_vocab_size()
    if mapping is not None and (mapping.shape != (vocab,) or mapping.min() < 0 or mapping.max() >= len(table)):
        raise EmbeddingError(f"{folder}: 'mapping' {mapping.shape} does not map {vocab} tokens to {len(table)} rows")
    if mapping is None and len(table) < vocab:
        raise EmbeddingError(f"{folder}: {len(table)} embedding rows for {vocab} tokens")
    if weights is not None and weights.shape != (vocab,):
        raise EmbeddingError(f"{folder}: 'weights' {weights.shape} is not one per token ({vocab})")
    return StaticEncoder(tokenizer, table, mapping, weights, bool(config.get("normalize", True)))
