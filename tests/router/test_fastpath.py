"""The proxy path's own costs: the completion routes ahead of FastAPI's middleware stack
(router/api/fastpath.py) and the exact cache's Redis client without a socket timeout (router/app.py
``cache_client``). Real router, replica and Redis."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

import pytest
import redis.asyncio.connection

from opskit.redis_client import async_redis
from router.app import cache_client
from router.forward import service
from sim.stack import RedisServer
from tests.router.conftest import CHAT


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


async def test_an_unexpected_error_is_a_500_in_openai_shape_without_its_text(
    start_replica, start_router, client, monkeypatch, caplog
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])

    async def broken(state: Any, request: Any, endpoint: str) -> Any:
        raise RuntimeError("secret /etc/promptedge/key")

    monkeypatch.setattr(service, "handle", broken)
    with caplog.at_level(logging.ERROR, logger="router"):
        response = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "secret" not in response.text
    # the operators' log has it, with its trace
    assert any(r.exc_info and "secret" in str(r.exc_info[1]) for r in caplog.records)


async def test_the_other_routes_still_pass_the_middleware_stack(start_replica, start_router, client) -> None:
    # what the fast path does not take keeps FastAPI's answers: the admin routes, a GET on a
    # completion path (405 with Allow), an unknown path (OpenAI's 404 wording)
    replica = await start_replica()
    router = await start_router([replica.url])
    assert (await client.get(router.url + "/health")).status_code == 200
    wrong = await client.get(router.url + "/v1/chat/completions")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
    unknown = await client.post(router.url + "/v1/chat/completion", json=CHAT)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "Invalid URL (POST /v1/chat/completion)"
    served = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert served.status_code == 200 and served.headers["x-cache"] == "miss"
    assert served.headers["x-request-id"]


async def test_a_hung_redis_holds_neither_start_up_nor_an_admin_delete(start_replica, start_router, client) -> None:
    # Attack round: with every cache call on the client without a socket timeout, a router
    # started against a stopped Redis waited out the semantic index rebuild's 60 s bound (70 s
    # to its first answer, 16 s before) and DELETE /cache its 30 s one (5 s before). Only the
    # exact lookup and store, bounded by the cache itself, go without a socket timeout.
    replica = await start_replica()
    with RedisServer() as own:
        assert own.process is not None
        own.process.send_signal(signal.SIGSTOP)  # accepts connections (kernel backlog), never answers
        try:
            began = time.monotonic()
            router = await start_router([replica.url], redis_url=own.url, admin_key="adm1n-test")
            start_up_s = time.monotonic() - began
            served = await client.post(router.url + "/v1/chat/completions", json=CHAT)
            began = time.monotonic()
            deleted = await client.delete(
                router.url + "/cache?all=true", timeout=60, headers={"authorization": "Bearer adm1n-test"}
            )
            delete_s = time.monotonic() - began
        finally:
            own.process.send_signal(signal.SIGCONT)
    assert served.status_code == 200 and served.headers["x-cache"] == "miss"
    assert deleted.status_code == 503
    assert (start_up_s < 40, delete_s < 20) == (True, True), f"start-up {start_up_s:.1f} s, delete {delete_s:.1f} s"


async def test_every_completion_route_is_declared_once_and_takes_the_fast_path(
    start_replica, start_router, client, monkeypatch
) -> None:
    # One table (router/api/routes.py ROUTES) is what the fast path serves and what the app
    # registers: /v1/responses was declared on the app but not in the fast path's table, so its
    # POSTs went through the whole middleware stack.
    from fastapi import FastAPI

    from router.api.routes import ROUTES

    router = await start_router([(await start_replica()).url])
    stacked: list[str] = []
    real = FastAPI.__call__

    async def through_the_stack(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            stacked.append(scope["path"])
        await real(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", through_the_stack)
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize", "/v1/responses"]
    assert sorted(ROUTES) == sorted(paths)
    for path in paths:
        answer = await client.post(router.url + path, content=b"{}", headers={"content-type": "application/json"})
        assert answer.status_code == 400, path  # the route's own validation: no model
    assert stacked == []
    # the same table registered on the app: another method is the stack's 405
    for path in paths:
        assert (await client.get(router.url + path)).status_code == 405
    assert stacked == paths
    registered = {r.path for r in router.app.routes if "POST" in getattr(r, "methods", ())}
    assert set(paths) <= registered
