"""Shared fixtures: the real data folder and a real Redis server.

Redis: ``PROMPTEDGE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``). Each test that asks
for ``redis_url`` gets that database flushed before and after it. When no server answers, the
fixture fails the test loudly instead of skipping, so CI cannot go green without Redis.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data folder (``PROMPTEDGE_DATA_DIR``, default ``../shared/data``)."""
    path = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.fail(f"real data folder not found: {path} (set PROMPTEDGE_DATA_DIR)")
    return path


@pytest.fixture()
def redis_url() -> str:
    """URL of a flushed, real Redis database for one test."""
    url = os.environ.get("PROMPTEDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"no Redis at {url}: {exc}")
    yield url
    client.flushdb()
    client.close()
