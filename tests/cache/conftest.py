"""Fixtures of the cache tests: one real embedding model per test session (loading is slow)."""

from __future__ import annotations

import pytest

from cache.embed.encoder import Encoder, SentenceTransformerEncoder
from cache.embed.load import shared_encoder


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    """The bundled all-MiniLM-L6-v2, loaded offline once per process and shared by every test
    (router apps started by tests use the same one): the default backend, ONNX Runtime."""
    return shared_encoder()


@pytest.fixture(scope="session")
def torch_encoder() -> SentenceTransformerEncoder:
    """The same model on torch, the reference the ONNX path must reproduce."""
    loaded = shared_encoder(backend="torch")
    assert isinstance(loaded, SentenceTransformerEncoder)
    return loaded
