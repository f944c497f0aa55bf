"""Admission: load-based shedding by priority (pure and live), fallback pool, API-key rate limits."""

from __future__ import annotations

import asyncio

import pytest

from router import ReplicaSpec, RouterSettings, create_app
from router.dispatch import ReplicaView, Weights
from router.dispatch.admission import pool_pressure, replica_pressure, sheds
from router.dispatch.signals import Signals
from tests.router.conftest import CHAT, MODEL, Served

W = Weights()


def view(waiting: float = 0, inflight: int = 0, kv: float = 0.0, age: float = 0.1) -> ReplicaView:
    return ReplicaView("r", inflight=inflight, signals=Signals(waiting=waiting, running=1, kv_usage=kv), age_s=age)


def test_pressure_levels_from_queue_hot_gpu_and_inflight() -> None:
    assert replica_pressure(view(waiting=3), 4, None, W) == 0
    assert replica_pressure(view(waiting=4), 4, None, W) == 1
    assert replica_pressure(view(kv=0.95), 4, None, W) == 1
    assert replica_pressure(view(waiting=8), 4, None, W) == 2
    assert replica_pressure(view(inflight=10), 4, 10, W) == 1
    assert replica_pressure(view(inflight=20), 4, 10, W) == 2
    assert replica_pressure(view(waiting=50, age=60.0), 4, None, W) == 0  # stale scrape: not trusted
    assert pool_pressure([view(waiting=8), view(waiting=0)], 4, None, W) == 0  # one replica has room


@pytest.mark.parametrize(("pressure", "shed"), [(0, ""), (1, "P2"), (2, "P1 P2")])
def test_p2_is_shed_first_then_p1_and_p0_never(pressure: int, shed: str) -> None:
    assert {p for p in ("P0", "P1", "P2") if sheds(p, pressure)} == set(shed.split())


async def load_behind_the_routers_back(client, replica, n: int, max_tokens: int = 100) -> list[asyncio.Task]:
    body = {**CHAT, "max_tokens": max_tokens}
    tasks = [asyncio.create_task(client.post(replica.url + "/v1/chat/completions", json=body)) for _ in range(n)]
    while True:
        text = (await client.get(replica.url + "/metrics")).text
        waiting = [line for line in text.splitlines() if line.startswith("vllm:num_requests_waiting")]
        if waiting and float(waiting[0].split()[-1]) >= n - 2:
            return tasks
        await asyncio.sleep(0.02)


async def test_saturated_pool_sheds_p2_then_p1_and_serves_p0(start_replica, start_router, client) -> None:
    replica = await start_replica()  # 2 sequences at a time
    router = await start_router([replica.url], queue_limit=2, scrape_interval_s=0.05, api_keys={"sk-ops": "ops"})
    tasks = await load_behind_the_routers_back(client, replica, 7)  # 5 waiting: overloaded (>= 2 x 2)
    await asyncio.sleep(0.15)
    url = router.url + "/v1/chat/completions"
    p2 = await client.post(url, json=CHAT, headers={"x-priority": "P2"})
    p1 = await client.post(url, json=CHAT, headers={"x-priority": "P1"})
    assert (p2.status_code, p1.status_code) == (429, 429)
    assert p2.json()["error"]["code"] == "pool_saturated" and p2.headers["retry-after"] == "1"
    p0 = await client.post(url, json=CHAT, headers={"x-priority": "P0", "authorization": "Bearer sk-ops"})
    assert p0.status_code == 200
    bad = await client.post(url, json=CHAT, headers={"x-priority": "urgent"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Priority"
    await asyncio.gather(*tasks)


async def test_fallback_pool_takes_the_overflow_and_says_so(start_replica, client, servers, redis_url) -> None:
    big = await start_replica()
    small = await start_replica(model="sim-small")
    specs = [ReplicaSpec(url=big.url, model=MODEL), ReplicaSpec(url=small.url, model="sim-small")]
    settings = RouterSettings(
        replicas=specs, redis_url=redis_url, queue_limit=2, scrape_interval_s=0.05, fallback={MODEL: "sim-small"}
    )
    router = await Served(create_app(settings)).start()
    servers.append(router)
    tasks = await load_behind_the_routers_back(client, big, 7)
    await asyncio.sleep(0.15)
    response = await client.post(router.url + "/v1/chat/completions", json=CHAT, headers={"x-priority": "P2"})
    assert response.status_code == 200
    assert response.headers["x-promptedge-fallback"] == "sim-small"
    assert response.headers["x-promptedge-replica"] == small.url
    assert response.json()["model"] == "sim-small"
    # issue 12: another model's embedding is in another vector space: shed, never a fallback
    embedding = await client.post(
        router.url + "/v1/embeddings", json={"model": MODEL, "input": "x"}, headers={"x-priority": "P2"}
    )
    assert embedding.status_code == 429 and embedding.json()["error"]["code"] == "pool_saturated"
    await asyncio.gather(*tasks)
    again = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert again.headers["x-cache"] == "miss"  # the small model's answer was not cached as the big one's
    assert "x-promptedge-fallback" not in again.headers


async def test_api_key_token_buckets_answer_429_with_retry_after(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router(
        [replica.url],
        api_keys={"key-alice": "a", "key-bob": "b"},
        rate_limits={"*": {"requests_per_s": 0.5, "burst": 2}, "key-tokens": {"tokens_per_min": 100}},
    )
    url = router.url + "/v1/chat/completions"
    alice = {"authorization": "Bearer key-alice"}
    statuses = [
        (await client.post(url, json={**CHAT, "temperature": 0.1 * i}, headers=alice)).status_code for i in range(3)
    ]
    assert statuses == [200, 200, 429]
    refused = await client.post(url, json=CHAT, headers=alice)
    assert refused.json()["error"]["type"] == "rate_limit_error" and int(refused.headers["retry-after"]) >= 1
    assert (await client.post(url, json=CHAT, headers={"authorization": "Bearer key-bob"})).status_code == 200
    tokens = {"authorization": "Bearer key-tokens"}
    first = await client.post(url, json={**CHAT, "max_tokens": 60}, headers=tokens)
    second = await client.post(url, json={**CHAT, "max_tokens": 60, "temperature": 0.3}, headers=tokens)
    assert (first.status_code, second.status_code) == (200, 429)


async def test_rate_limits_fail_open_when_redis_is_down(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router(
        [replica.url], redis_url="redis://127.0.0.1:1/0", rate_limits={"*": {"requests_per_s": 0.1, "burst": 1}}
    )
    for _ in range(3):
        assert (await client.post(router.url + "/v1/chat/completions", json=CHAT)).status_code == 200
    assert router.app.state.router.limiter.unavailable >= 1
