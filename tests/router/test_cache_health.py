"""The cache's health is re-probed in the background (issue 13, finding 9): after Redis comes
back, an idle router's /health turns ok again without any request arriving."""

from __future__ import annotations

import asyncio

from sim.stack import RedisServer
from tests.router.conftest import CHAT


async def _health_until(client, url: str, status: str, tries: int = 150) -> dict:
    body: dict = {}
    for _ in range(tries):  # 0.1 s apart: a bound for a slow machine, not a speed claim
        body = (await client.get(f"{url}/health")).json()
        if body["status"] == status:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"/health never became {status}: {body}")


async def test_health_recovers_while_idle_after_redis_restarts(
    start_replica, start_router, client, monkeypatch
) -> None:
    monkeypatch.setenv("PROMPTEDGE_CACHE_HEALTH_INTERVAL_S", "0.5")
    with RedisServer() as server:
        replica = await start_replica()
        router = await start_router([replica.url], redis_url=server.url)
        await _health_until(client, router.url, "ok")
        server.kill()  # a real Redis process dies (SIGKILL)
        answered = await client.post(f"{router.url}/v1/chat/completions", json=CHAT)
        assert answered.status_code == 200 and answered.headers["x-cache"] == "miss"  # served uncached
        down = await _health_until(client, router.url, "degraded")
        assert down["cache"] is False
        server.start()  # same port; from here on the router sees no request at all
        up = await _health_until(client, router.url, "ok")
        assert up["redis"] is True and up["cache"] is True
