"""The proxy path's own costs: the completion routes ahead of FastAPI's middleware stack
(router/fastpath.py) and the exact cache's Redis client without a socket timeout (router/app.py
``cache_client``). Real router, replica and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio.connection

from opskit.redis_client import async_redis
from router.app import cache_client


def _count_wait_for(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``asyncio.wait_for`` redis-py's connections start (a Task each on Python 3.11), by
    the awaited coroutine's name."""
    started: list[str] = []
    real = asyncio.wait_for

    async def counting(fut: Any, timeout: float | None) -> Any:
        started.append(getattr(fut, "__qualname__", repr(fut)))
        return await real(fut, timeout)

    monkeypatch.setattr(redis.asyncio.connection.asyncio, "wait_for", counting)
    return started


async def test_the_cache_client_sends_commands_without_a_task_each(redis_url, monkeypatch) -> None:
    # redis-py 8 gives a client that names no socket timeout a 5 s one, sent through wait_for:
    # the router's "no socket timeout" client had one until it said None out loud.
    started = _count_wait_for(monkeypatch)
    default = async_redis(redis_url)
    try:
        await default.get("promptedge:test:fastpath")
    finally:
        await default.aclose()
    assert started, "the default client sends through wait_for: this test can see it"
    started.clear()
    client = cache_client(redis_url)
    try:
        for _ in range(3):
            await client.get("promptedge:test:fastpath")
    finally:
        await client.aclose()
    assert started == []
