"""Fixtures of the cache tests: one real embedding model per test session (loading is slow)."""

from __future__ import annotations

import pytest

from cache.embed import SentenceTransformerEncoder, shared_encoder


@pytest.fixture(scope="session")
def encoder() -> SentenceTransformerEncoder:
    """The bundled all-MiniLM-L6-v2, loaded offline once per process and shared by every test
    (router apps started by tests use the same one)."""
    return shared_encoder()
