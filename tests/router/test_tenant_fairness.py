"""Issue 13 attack findings A7, A8, A14: a client cannot take another tenant's share of the
router (rate limits, priority) nor read other tenants' traffic. Real router, sim replicas, Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
import redis.asyncio

from tests.router.conftest import CHAT
from tests.router.test_admission import load_behind_the_routers_back

URL = "/v1/chat/completions"
KEYS = {"sk-alice": "team-a", "sk-bob": "team-b"}


async def test_anonymous_p0_claim_is_lowered_and_logged(
    start_replica, start_router, client, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression A8: any anonymous client could send X-Priority: P0 and be served while keyed
    # tenants' P1 requests were shed with 429 pool_saturated.
    replica = await start_replica()
    router = await start_router(
        [replica.url], queue_limit=2, scrape_interval_s=0.05, api_keys=KEYS, max_priority={"team-b": "P2"}
    )
    tasks = await load_behind_the_routers_back(client, replica, 7)  # overloaded: P1 and P2 shed
    await asyncio.sleep(0.15)
    url = router.url + URL
    caplog.set_level(logging.INFO, logger="router.access")
    anonymous = await client.post(url, json=CHAT, headers={"x-priority": "P0", "x-request-id": "anon-p0"})
    unmapped = await client.post(
        url, json=CHAT, headers={"x-priority": "P0", "authorization": "Bearer sk-" + os.urandom(8).hex()}
    )
    bob = await client.post(url, json=CHAT, headers={"x-priority": "P0", "authorization": "Bearer sk-bob"})
    alice = await client.post(url, json=CHAT, headers={"x-priority": "P0", "authorization": "Bearer sk-alice"})
    assert (anonymous.status_code, unmapped.status_code, bob.status_code) == (429, 429, 429)
    assert anonymous.json()["error"]["code"] == "pool_saturated"
    assert alice.status_code == 200  # a mapped tenant without a bound may claim P0
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "router.access"]
    line = next(x for x in lines if x["request_id"] == "anon-p0")
    assert (line["priority"], line["claimed_priority"]) == ("P1", "P0")
    await asyncio.gather(*tasks)


async def test_random_api_keys_share_the_star_bucket(start_replica, start_router, client) -> None:
    # Regression A7: every unlisted API key got its own "*" bucket: 10 random keys were all
    # admitted against {"*": 1 rps, burst 2}.
    replica = await start_replica()
    router = await start_router([replica.url], api_keys=KEYS, rate_limits={"*": {"requests_per_s": 0.2, "burst": 2}})
    url = router.url + URL
    statuses = []
    for i in range(6):
        key = "sk-" + os.urandom(8).hex()
        response = await client.post(
            url, json={**CHAT, "temperature": 0.01 * i}, headers={"authorization": f"Bearer {key}"}
        )
        statuses.append(response.status_code)
    assert statuses[:2] == [200, 200] and set(statuses[2:]) == {429}
    # without a key is the same group; mapped keys keep a "*"-sized bucket of their own each
    assert (await client.post(url, json=CHAT)).status_code == 429
    for key in KEYS:
        response = await client.post(url, json=CHAT, headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200


async def test_cache_stats_per_tenant_needs_the_admin_key(start_replica, start_router, client) -> None:
    # Regression A14: /cache/stats showed every tenant's name and traffic to anonymous clients.
    router = await start_router([(await start_replica()).url], api_keys=KEYS, admin_key="sk-admin")
    await client.post(router.url + URL, json=CHAT, headers={"authorization": "Bearer sk-alice"})
    for headers in ({}, {"authorization": "Bearer sk-alice"}, {"authorization": "Bearer wrong"}):
        stats = (await client.get(router.url + "/cache/stats", headers=headers)).json()
        assert stats["requests"] >= 1 and "per_model" in stats
        assert "per_tenant" not in stats and "team-a" not in json.dumps(stats)
        assert all("per_tenant" not in w for w in stats["windows"].values())
    admin = (await client.get(router.url + "/cache/stats", headers={"authorization": "Bearer sk-admin"})).json()
    assert admin["per_tenant"]["team-a"]["requests"] == 1


async def semantic_tenants(redis_url: str) -> list[str]:
    """The tenant of every live semantic entry in Redis."""
    r = redis.asyncio.Redis.from_url(redis_url)
    try:
        keys = await r.keys("promptedge:cache:sem:entry:*")
        return [t.decode() for t in [await r.hget(k, "tenant") for k in keys] if t is not None]
    finally:
        await r.aclose()


async def store_semantic(client, url: str, key: str, texts: list[str], redis_url: str, headers: dict) -> None:
    """Send each text once as a miss (no lookup) and wait until its semantic entry is written."""
    for text in texts:
        before = len(await semantic_tenants(redis_url))
        response = await client.post(
            url,
            json={**CHAT, "messages": [{"role": "user", "content": text}]},
            headers={"authorization": f"Bearer {key}", "cache-control": "no-cache", **headers},
        )
        assert response.status_code == 200
        for _ in range(200):  # stored after the answer; an eviction keeps the count
            tenants = await semantic_tenants(redis_url)
            if len(tenants) > before or len(tenants) >= 10:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_one_tenant_cannot_evict_the_others(
    start_replica, start_router, client, redis_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression A10: with MAX_ENTRIES 20, bob's 25 misses with X-Cache-TTL 604800 evicted all of
    # alice's semantic entries (eviction took the soonest-expiring entry: always another
    # tenant's default-TTL one), and alice's new entries were evicted at once.
    monkeypatch.setenv("PROMPTEDGE_CACHE_MAX_ENTRIES", "10")
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    for _ in range(600):
        if (await client.get(router.url + "/health")).json()["semantic"] == "ready":
            break
        await asyncio.sleep(0.1)
    url = router.url + URL
    alice = [f"How do I bake {food} at home?" for food in ("sourdough bread", "lasagna", "cheesecake", "bagels")]
    bob = [
        f"Explain the history of {topic} in two sentences."
        for topic in (
            "the Roman empire",
            "jazz",
            "the printing press",
            "chess",
            "the bicycle",
            "vaccines",
            "the telescope",
            "paper money",
            "railways",
            "the compass",
            "photography",
            "the steam engine",
            "radio",
            "cinema",
            "aviation",
        )
    ]
    await store_semantic(client, url, "sk-alice", alice, redis_url, {})
    await store_semantic(client, url, "sk-bob", bob, redis_url, {"x-cache-ttl": "604800"})
    tenants = await semantic_tenants(redis_url)
    assert len(tenants) <= 10 and tenants.count("team-a") == 4, tenants
    await store_semantic(client, url, "sk-alice", ["How do I grow tomatoes on a balcony?"], redis_url, {})
    tenants = await semantic_tenants(redis_url)
    assert tenants.count("team-a") == 5, tenants  # alice's new entry stays; bob, over his share, pays


def test_bucket_owner_groups_unlisted_keys_and_keeps_listed_ones_apart() -> None:
    from router.forward.ratelimit import bucket_owner
    from router.settings import RateLimit

    star, own = RateLimit(requests_per_s=1), RateLimit(requests_per_s=9)
    limits = {"*": star, "sk-vip": own}
    assert bucket_owner("sk-vip", limits, KEYS) == ("sk-vip", own)
    assert bucket_owner("sk-alice", limits, KEYS) == ("sk-alice", star)  # mapped: own "*"-sized buckets
    assert bucket_owner("sk-random", limits, KEYS) == ("*", star) == bucket_owner("", limits, KEYS)
    assert bucket_owner("*", limits, KEYS) == ("*", star)
    assert bucket_owner("sk-random", {}, KEYS) == ("*", None)


def test_bounded_priority_lowers_claims_above_the_tenants_bound() -> None:
    from router.forward.classify import bounded_priority

    assert bounded_priority("P0", "", KEYS, {}) == "P1"
    assert bounded_priority("P0", "sk-random", KEYS, {}) == "P1"
    assert bounded_priority("P2", "", KEYS, {}) == "P2"  # a lower claim is kept
    assert bounded_priority("P0", "sk-alice", KEYS, {}) == "P0"
    assert bounded_priority("P0", "sk-bob", KEYS, {"team-b": "P2"}) == "P2"
    assert bounded_priority("P0", "", KEYS, {"*": "P0"}) == "P0"


def test_max_priority_names_known_tenants_only() -> None:
    from pydantic import ValidationError

    from router.settings import RouterSettings

    with pytest.raises(ValidationError) as err:
        RouterSettings(api_keys=KEYS, max_priority={"team-c": "P0"})
    assert "team-c" in str(err.value) and "sk-alice" not in str(err.value)
    assert RouterSettings(api_keys=KEYS, max_priority={"*": "P2", "team-a": "P1"}).max_priority["*"] == "P2"
