"""Predictive cache warming end to end (router/caching/warming.py): the real router app, a real simulated
replica over HTTP, a real Redis; history written by the cache's own Popularity, the forecast by the
forecaster's own ``forecast_document`` (the JSON contract between the two processes)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from cache import CacheRequest, exact_key
from cache.stats import metrics as cache_metrics
from cache.warming.plan import slot_bounds
from cache.warming.popularity import Popularity, count_key
from cache.warming.settings import WarmingSettings
from forecaster.plan import PlanStep
from forecaster.state import FORECAST_KEY, forecast_document
from router.caching.warming import FORECAST_KEY as ROUTER_FORECAST_KEY
from router.caching.warming import parse_forecast
from tests.router.conftest import MODEL

PREFIX = "promptedge:cache"
KEYS = {"key-acme": "acme", "key-beta": "beta"}
WARMING = {
    "enabled": True,
    "tick_s": 0.1,
    "history_days": 3,
    "min_days_seen": 2,
    "budget_per_min": 600.0,
    "burst": 10.0,
    "replica_slots": 2,
}


def chat(text: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}


def key_of(body: dict, tenant: str = "acme") -> str:
    return exact_key(PREFIX, "chat.completions", body, tenant, None, MODEL)


@pytest.fixture(autouse=True)
def no_semantic(exact_only: None) -> None:
    """Exact stage only: no embedding model to load (the store path is the same)."""


@pytest.fixture()
def warming(monkeypatch: pytest.MonkeyPatch):
    """``warming(**overrides)`` turns warming on for MODEL in routers started afterwards."""

    def turn_on(**overrides: object) -> dict:
        settings = {**WARMING, **overrides}
        monkeypatch.setenv("PROMPTEDGE_CACHE_WARMING", json.dumps({MODEL: settings}))
        return settings

    return turn_on


@pytest.fixture()
async def store(redis_url: str):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def seed(
    store: aioredis.Redis, texts: list[str], settings: dict | None = None, tenant: str = "acme", forecast: bool = True
) -> None:
    """History: each text asked by ``tenant`` on the two days before, in the slot of the peak;
    the forecast (``publish``) unless ``forecast`` is False."""
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    warm = WarmingSettings(**(settings or WARMING))
    popularity = Popularity(store, PREFIX)
    for back in (1, 2):
        for text in texts:
            req = CacheRequest("chat.completions", chat(text), tenant, pool=MODEL)
            assert await popularity.record(req, key_of(chat(text), tenant), warm, slot_start - back * 86400 + 1)
    if forecast:
        await publish(store)


async def publish(store: aioredis.Redis) -> None:
    """The forecast, as the forecaster writes it: a rise to 10 req/s (capacity 10) two minutes ahead."""
    now = time.time()
    steps = [PlanStep(0, now, 1.0, 1.5, 1), PlanStep(1, now + 120, 10.0, 12.0, 1)]
    document = forecast_document(MODEL, now, steps, capacity_per_replica=10.0, replicas=1, unit="requests")
    await store.set(FORECAST_KEY.format(pool=MODEL), json.dumps(document), ex=120)


async def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def warm_count(client, router, outcome: str) -> float:
    text = (await client.get(router.url + "/metrics")).text
    line = f'promptedge_router_warm_generations_total{{outcome="{outcome}",pool="{MODEL}"}} '
    found = [float(row[len(line) :]) for row in text.splitlines() if row.startswith(line)]
    return found[0] if found else 0.0


def test_forecast_contract_keys_agree() -> None:
    assert ROUTER_FORECAST_KEY == FORECAST_KEY
    steps = [PlanStep(0, 100.0, 1.0, 2.0, 1)]
    parsed = parse_forecast(json.dumps(forecast_document("m", 50.0, steps, 2.0, 3, "requests")))
    assert parsed is not None and parsed.points == [(100.0, 1.0)] and parsed.capacity == 6.0 and parsed.at == 50.0
    assert parse_forecast(json.dumps({"v": 2, "pool": "m"})) is None
    assert parse_forecast(b"not json") is None and parse_forecast(None) is None


async def test_expired_hot_entry_is_warmed_before_the_peak_for_its_own_tenant_only(
    start_replica, start_router, client, store, warming
) -> None:
    warming()
    await seed(store, ["What is a KV cache?"])
    body = chat("What is a KV cache?")
    hits_before = cache_metrics.WARM_HITS.labels(MODEL)._value.get()
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    assert await wait_for(lambda: store.exists(key_of(body))), "the hot entry was never regenerated"
    assert await store.ttl(key_of(body)) > 3000  # a fresh entry, for the whole peak
    url = router.url + "/v1/chat/completions"
    hit = await client.post(url, json=body, headers={"authorization": "Bearer key-acme"})
    assert hit.status_code == 200 and hit.headers["x-cache"] == "exact"
    assert await wait_for(lambda: _true(cache_metrics.WARM_HITS.labels(MODEL)._value.get() == hits_before + 1))
    other = await client.post(url, json=body, headers={"authorization": "Bearer key-beta", "cache-control": "no-store"})
    assert other.headers["x-cache"] == "miss"  # another tenant's scope: never the warmed answer
    assert (await warm_count(client, router, "attempted"), await warm_count(client, router, "stored")) == (1.0, 1.0)


async def _true(value: bool) -> bool:
    return value


async def test_warming_off_by_default_warms_and_records_nothing(start_replica, start_router, client, store) -> None:
    await seed(store, ["What is a KV cache?"])
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    body = chat("Something else entirely")
    response = await client.post(
        router.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer key-acme"}
    )
    assert response.headers["x-cache"] == "miss"
    assert await wait_for(lambda: store.exists(key_of(body)))  # the miss was stored ...
    await asyncio.sleep(1.0)
    assert not await store.exists(key_of(chat("What is a KV cache?")))  # ... nothing was warmed
    today = count_key(PREFIX, MODEL, int(time.time() // 86400), int(time.time() % 86400 // 600))
    assert not await store.exists(today)  # and the client's request was not counted
    assert await warm_count(client, router, "attempted") == 0.0


async def test_the_budget_paces_warm_generations(start_replica, start_router, client, store, warming) -> None:
    settings = warming(budget_per_min=30.0, burst=1.0)  # one every 2 s
    texts = [f"Question number {i}?" for i in range(4)]
    await seed(store, texts, settings)
    router = await start_router([(await start_replica()).url], api_keys=KEYS)

    async def stored() -> int:
        return sum([await store.exists(key_of(chat(t))) for t in texts])

    assert await wait_for(lambda: _true_async(stored, lambda n: n >= 1))
    await asyncio.sleep(1.2)
    assert await stored() == 1  # the next token comes 2 s after the first
    assert await wait_for(lambda: _true_async(stored, lambda n: n >= 2), timeout_s=5.0)
    assert await warm_count(client, router, "attempted") <= 3


async def _true_async(get, test) -> bool:
    return bool(test(await get()))


async def test_nothing_is_warmed_while_the_pool_is_busy(start_replica, start_router, client, store, warming) -> None:
    warming(replica_slots=1, idle_load=0.5)  # one request in flight is a busy pool
    await seed(store, ["What is a KV cache?"], forecast=False)
    replica = await start_replica()  # 2 sequences at once: a warm generation would run beside it
    router = await start_router([replica.url], api_keys=KEYS)
    url = router.url + "/v1/chat/completions"
    long = {**chat("Tell me a long story."), "max_tokens": 300}  # 300 decode steps of 5 ms
    busy = asyncio.create_task(client.post(url, json=long, headers={"cache-control": "no-store"}))
    started = time.monotonic()
    await asyncio.sleep(0.2)  # the pool is busy when the peak is forecast
    await publish(store)
    while not busy.done():
        assert await warm_count(client, router, "attempted") == 0.0, (
            f"warming began {time.monotonic() - started:.2f} s into a busy pool"
        )
        await asyncio.sleep(0.02)
    assert busy.result().status_code == 200
    assert time.monotonic() - started > 1.0  # the pool was busy long enough to matter
    assert await wait_for(lambda: store.exists(key_of(chat("What is a KV cache?"))))  # idle again: warmed


async def test_a_replica_failing_during_warming_caches_nothing(
    start_replica, start_router, client, store, warming
) -> None:
    warming()
    replica = await start_replica()
    await (await client.post(replica.url + "/sim/faults", json={"fail_rate": 1.0})).aread()
    await seed(store, ["What is a KV cache?"])
    router = await start_router([replica.url], api_keys=KEYS)
    assert await wait_for(lambda: _true_async(lambda: warm_count(client, router, "failed"), lambda n: n >= 1))
    assert not await store.exists(key_of(chat("What is a KV cache?")))
    assert await warm_count(client, router, "stored") == 0.0
    assert await store.keys(f"{PREFIX}:exact:*") == []


async def test_of_several_workers_one_warms_a_pool(start_replica, start_router, client, store, warming) -> None:
    warming()
    texts = [f"Question number {i}?" for i in range(4)]
    await seed(store, texts)
    replica = await start_replica()
    # started together: without the lock both would plan the same keys before either stored one
    routers = await asyncio.gather(*(start_router([replica.url], api_keys=KEYS) for _ in range(2)))

    async def all_stored() -> bool:
        return all([await store.exists(key_of(chat(t))) for t in texts])

    assert await wait_for(all_stored)
    await asyncio.sleep(0.5)  # time for the other worker to (wrongly) warm them too
    attempted = sorted([await warm_count(client, r, "attempted") for r in routers])
    assert attempted == [0.0, 4.0]


async def test_a_request_the_pool_policy_keeps_out_is_not_warmed(
    start_replica, start_router, client, store, warming
) -> None:
    warming()
    sampled = {**chat("Write a poem."), "temperature": 0.7}
    popularity = Popularity(store, PREFIX)
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    for back in (1, 2):  # counted while the policy still cached sampled answers
        req = CacheRequest("chat.completions", sampled, "acme", pool=MODEL)
        assert await popularity.record(req, key_of(sampled), WarmingSettings(**WARMING), slot_start - back * 86400 + 1)
    await publish(store)
    router = await start_router(
        [(await start_replica()).url], api_keys=KEYS, cache_policy={"*": {"cache_sampled": False}}
    )
    await asyncio.sleep(1.0)
    assert not await store.exists(key_of(sampled))
    assert await warm_count(client, router, "attempted") == 0.0
