"""The router on a real local Redis Cluster (three masters, tests/conftest.py), started from a
``redis+cluster://`` URL: exact cache, rate limits (one script over an owner's two buckets),
traffic counters read back by the forecaster, /cache/stats and DELETE /cache."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from forecaster.sources.redis_counters import RedisCounterSource
from sim.stack.redis_topology import LocalCluster
from tests.router.conftest import CHAT, MODEL

pytestmark = pytest.mark.redis_ha


async def test_router_caches_limits_counts_and_deletes_on_a_cluster(
    start_replica, start_router, client, cluster_url: str, exact_only: None
) -> None:
    replica = await start_replica()
    router = await start_router(
        [replica.url],
        redis_url=cluster_url,
        admin_key="key-admin",
        api_keys={"key-alice": "alice"},
        # both buckets at once: the script touches the owner's two keys, which must share a slot
        rate_limits={"key-alice": {"requests_per_s": 0.5, "burst": 2, "tokens_per_min": 10_000}},
    )
    url = router.url + "/v1/chat/completions"
    assert (await client.post(url, json=CHAT)).headers["x-cache"] == "miss"
    for _ in range(100):  # the answer is stored just after it was sent
        again = await client.post(url, json=CHAT)
        if again.headers["x-cache"] == "exact":
            break
        await asyncio.sleep(0.02)
    assert again.status_code == 200 and again.headers["x-cache"] == "exact"

    alice = {"authorization": "Bearer key-alice"}
    statuses = [
        (await client.post(url, json={**CHAT, "temperature": 0.1 * i}, headers=alice)).status_code for i in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert router.app.state.router.limiter.unavailable == 0  # decided by Redis, not failed open

    admin = {"authorization": "Bearer key-admin"}
    stats = (await client.get(router.url + "/cache/stats", headers=admin)).json()
    assert stats["exact_hits"] >= 1 and stats["requests"] >= 2
    deleted = await client.delete(router.url + "/cache", params={"tenant": "default"}, headers=admin)
    assert deleted.status_code == 200 and deleted.json()["deleted"]["exact"] == 1
    assert (await client.post(url, json=CHAT)).headers["x-cache"] == "miss"
    assert (await client.get(router.url + "/health")).json()["cache"] is True

    # the forecaster reads what the router counted, from the same cluster
    source = RedisCounterSource(cluster_url, MODEL, history_s=600, timeout_s=2)
    counted = 0.0
    for _ in range(100):
        # the raw counts: the minutes this test spans are the router's first (partial) one and
        # the one it is still counting, which the forecaster reads as missing, never as demand
        counts = source.read_counts(time.time() + 60)
        counted = float(np.sum(counts.sums["requests"]))
        if counted >= 5:
            break
        await asyncio.sleep(0.05)
    assert counted >= 5  # every answered request above (two misses, a hit, alice's two)


async def test_router_fails_open_when_every_cluster_node_dies(
    start_replica, start_router, client, exact_only: None
) -> None:
    # Regression: redis-py's cluster client raises its own RedisClusterException (no
    # RedisError) for a script whose keys are in two slots and for a cluster it cannot reach;
    # the rate limiter let it through as a 500.
    with LocalCluster() as cluster:
        replica = await start_replica()
        router = await start_router(
            [replica.url],
            redis_url=cluster.url,
            api_keys={"key-alice": "alice"},
            rate_limits={"key-alice": {"requests_per_s": 100, "tokens_per_min": 100_000}},
        )
        url = router.url + "/v1/chat/completions"
        alice = {"authorization": "Bearer key-alice"}
        assert (await client.post(url, json=CHAT, headers=alice)).status_code == 200
        for server in cluster.servers:
            server.kill()  # every master dies (SIGKILL): no slot is served
        for i in range(4):
            answered = await client.post(url, json={**CHAT, "seed": i}, headers=alice)
            assert answered.status_code == 200 and answered.headers["x-cache"] == "miss", answered.text
        health = (await client.get(router.url + "/health")).json()
        assert health["status"] == "degraded" and health["redis"] is False
