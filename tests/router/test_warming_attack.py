"""Attacks on predictive cache warming (router/caching/warming.py, cache/warming/): regression tests for
what a security / SRE review found. Real router app, real sim replica over HTTP, real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from cache import CacheControl, CacheRequest
from cache.warming.plan import slot_bounds
from cache.warming.popularity import Popularity
from cache.warming.settings import WarmingSettings
from router.caching.warming import FORECAST_KEY, PoolWarmer, parse_forecast
from tests.router.conftest import MODEL
from tests.router.test_warming import (  # noqa: F401
    KEYS,
    PREFIX,
    WARMING,
    chat,
    key_of,
    no_semantic,
    publish,
    seed,
    store,
    wait_for,
    warm_count,
    warming,
)


def _doc(points: list, capacity: object = 10.0) -> dict:
    return {
        "v": 1,
        "pool": MODEL,
        "at": time.time(),
        "unit": "requests",
        "capacity_rps": capacity,
        "points": points,
        "upper": points,
    }


# --- the forecast key: whatever is in it, the warmer must not crash, warm wildly, or stay silent ---


@pytest.mark.parametrize(
    "raw",
    [
        # an integer too large for a float: float() raises OverflowError, which parse_forecast does not catch
        '{"v":1,"pool":"m","at":0,"unit":"requests","capacity_rps":1' + "0" * 400 + ',"points":[]}',
        # nested deeper than json's recursion limit: RecursionError
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["int-overflow", "deep-nesting"],
)
def test_a_malformed_forecast_is_refused_not_raised(raw: str) -> None:
    assert parse_forecast(raw) is None


@pytest.mark.parametrize(
    "points, capacity",
    [
        ([[0, 1.0], [120, math.nan]], 10.0),  # NaN peak: every comparison is False, so it passes as a peak
        ([[0, 1.0], [120, 2.0]], math.nan),  # NaN capacity: any rise is a peak
        ([[0, 1.0], [120, math.inf]], 10.0),  # infinite demand
    ],
    ids=["nan-peak", "nan-capacity", "inf-peak"],
)
def test_a_forecast_with_non_finite_values_is_refused(points: list, capacity: float) -> None:
    now = time.time()
    raw = json.dumps(_doc([[now + t, v] for t, v in points], capacity))
    assert parse_forecast(raw) is None


async def test_an_overflowing_forecast_does_not_kill_the_warming_task_nor_stall_it(
    start_replica, start_router, client, store, warming, caplog
) -> None:  # noqa: F811
    """One bad document made the pool's task die (OverflowError escapes ``step``), the supervisor
    log a traceback and restart it under a new lock holder id; the dead holder's lock then kept
    the new task from warming for ``lock_ttl_s`` (60 s) after a good forecast came back."""
    caplog.set_level(logging.INFO, logger="router.warming")
    warming()
    await seed(store, ["What is a KV cache?"], forecast=False)
    bad = '{"v":1,"pool":"%s","at":0,"unit":"requests","capacity_rps":1%s,"points":[]}' % (MODEL, "0" * 400)
    await store.set(FORECAST_KEY.format(pool=MODEL), bad, ex=120)
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.sleep(1.5)
    crashed = [r for r in caplog.records if "stopped on an error" in r.getMessage()]
    await publish(store)  # the forecaster writes a good one again
    warmed = await wait_for(lambda: store.exists(key_of(chat("What is a KV cache?"))), timeout_s=8.0)
    assert warmed, "warming stayed stalled after the forecast was good again"
    assert crashed == [], "the warming task died on a malformed forecast"
    assert (await client.get(router.url + "/health")).status_code == 200


async def test_a_nan_forecast_warms_nothing(start_replica, start_router, client, store, warming) -> None:  # noqa: F811
    warming()
    await seed(store, ["What is a KV cache?"], forecast=False)
    now = time.time()
    document = _doc([[now, 1.0], [now + 120, math.nan]], 10.0)
    await store.set(FORECAST_KEY.format(pool=MODEL), json.dumps(document), ex=120)
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.sleep(1.5)
    assert await warm_count(client, router, "attempted") == 0.0
    assert not await store.exists(key_of(chat("What is a KV cache?")))


async def test_a_malformed_forecast_is_logged(
    start_replica,
    start_router,
    client,
    store,
    warming,  # noqa: F811
    caplog,
) -> None:
    """A forecast that is there but unusable (garbage, another version) must say so in the log:
    the operator otherwise sees warming silently do nothing."""
    caplog.set_level(logging.DEBUG, logger="router.warming")
    warming()
    await store.set(FORECAST_KEY.format(pool=MODEL), b"{not json", ex=120)
    await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.sleep(1.0)
    said = [
        r
        for r in caplog.records
        if r.name == "router.warming" and "forecast" in r.getMessage().lower() and r.levelno >= logging.WARNING
    ]
    assert said, "a malformed forecast was ignored without a word"


# --- abuse: one tenant against the pool's shared popularity sets ---


async def test_one_tenant_cannot_evict_another_tenants_hot_keys(store) -> None:  # noqa: F811
    """The count sets are per pool, shared by every tenant, trimmed to ``keep_per_slot`` by lowest
    count: a tenant (or anonymous clients) asking ``keep_per_slot`` prompts of its own a few
    times each (exact hits are cheap) evicts every other tenant's history and takes the whole
    warming budget of the pool."""
    settings = WarmingSettings(**WARMING)  # keep_per_slot 100
    popularity = Popularity(store, PREFIX)
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    victim = chat("What is a KV cache?")
    for back in (1, 2):
        at = slot_start - back * 86400 + 1
        for _ in range(5):  # acme's hot prompt: 5 requests a day in this slot
            assert await popularity.record(
                CacheRequest("chat.completions", victim, "acme", pool=MODEL), key_of(victim), settings, at
            )
        for i in range(settings.keep_per_slot):  # beta: 100 prompts, 6 times each
            body = chat(f"flood {i}")
            for _ in range(6):
                assert await popularity.record(
                    CacheRequest("chat.completions", body, "beta", pool=MODEL), key_of(body, "beta"), settings, at
                )
    found = [c.key for c in await popularity.candidates(MODEL, slot_start, settings, time.time())]
    assert key_of(victim) in found, "another tenant's flood evicted acme's hot prompt from warming"


# --- budget spent on entries that cannot live until the peak ---


async def test_an_entry_that_would_expire_before_the_peak_is_not_generated(
    start_replica, start_router, client, store, warming
) -> None:  # noqa: F811
    """A recipe with a short TTL (``X-Cache-TTL: 5``, or a replica's ``max-age``) is regenerated
    minutes before the peak slot starts: its entry is gone before the first peak request, so
    every such generation is GPU spent for nothing (and a tenant chooses its TTL)."""
    settings = warming(lead_s=1800)
    now = time.time()
    next_start, _ = slot_bounds(now + 600, 600)
    if next_start - now < 180:  # the slot after, so that it starts minutes from now
        next_start += 600
    popularity = Popularity(store, PREFIX)
    body = chat("What is a KV cache?")
    for back in (1, 2):
        req = CacheRequest("chat.completions", body, "acme", CacheControl(ttl_s=5), pool=MODEL)
        assert await popularity.record(req, key_of(body), WarmingSettings(**settings), next_start - back * 86400 + 1)
    document = _doc([[now, 1.0], [next_start + 60, 10.0]], 10.0)
    await store.set(FORECAST_KEY.format(pool=MODEL), json.dumps(document), ex=120)
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.sleep(2.0)
    assert await warm_count(client, router, "attempted") == 0.0, (
        f"warmed an entry with a 5 s TTL {next_start - now:.0f} s before its slot starts"
    )


# --- the lock: one worker per pool, also while a generation outlasts the lock's TTL ---


async def test_a_long_generation_does_not_let_a_second_worker_warm_the_pool(
    start_replica, start_router, client, store, warming
) -> None:  # noqa: F811
    """The lock is renewed only between generations; a generation longer than ``lock_ttl_s``
    (P2's ttfb_s is 60 s, the default lock_ttl_s 60 s, and nothing ties them) lets the lock
    expire, and a second worker warms the same pool at the same time (twice the budget)."""
    warming(lock_ttl_s=1, replica_slots=8)  # a generation in flight leaves the pool idle
    texts = [f"Question number {i}?" for i in range(4)]
    popularity = Popularity(store, PREFIX)
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    for back in (1, 2):
        for text in texts:
            body = {**chat(text), "max_tokens": 500}  # 500 decode steps of 5 ms: 2.5 s per generation
            req = CacheRequest("chat.completions", body, "acme", pool=MODEL)
            assert await popularity.record(req, key_of(body), WarmingSettings(**WARMING), slot_start - back * 86400 + 1)
    await publish(store)
    replica = await start_replica()
    routers = await asyncio.gather(*(start_router([replica.url], api_keys=KEYS) for _ in range(2)))
    await asyncio.sleep(4.0)
    attempted = sorted([await warm_count(client, r, "attempted") for r in routers])
    assert attempted[0] == 0.0, f"both workers warmed the pool: {attempted}"


# --- warming that can store nothing must not spend GPU ---


async def test_no_warm_generation_while_the_cache_is_disabled(
    start_replica,
    start_router,
    client,
    store,  # noqa: F811
    warming,
    monkeypatch,
) -> None:
    """With ``PROMPTEDGE_CACHE_ENABLED=false`` (an operator switching the cache off, e.g. in an
    incident) and warming still configured, the warmer kept generating the last 8 days' hot
    prompts before every peak; each answer is refused by the store ("failed"): GPU for nothing."""
    warming()
    monkeypatch.setenv("PROMPTEDGE_CACHE_ENABLED", "false")
    await seed(store, ["What is a KV cache?", "What is paged attention?"])
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.sleep(2.0)
    assert await warm_count(client, router, "attempted") == 0.0


# --- retention: the prompts kept for warming must stay deletable ---


async def test_delete_cache_removes_warming_recipes_after_warming_is_switched_off(
    start_replica, start_router, client, store, warming, monkeypatch
) -> None:  # noqa: F811
    """Recipes (whole prompts) live ``history_days + 1`` days. Once PROMPTEDGE_CACHE_WARMING is
    unset, ``DELETE /cache?tenant=`` no longer looks at them (``ResponseCache.delete`` runs
    ``forget`` only ``if self.settings.warming``): a tenant's erasure request leaves its prompts
    in Redis for up to 8 days with no API to remove them."""
    warming()
    replica = await start_replica()
    first = await start_router([replica.url], api_keys=KEYS)
    response = await client.post(
        first.url + "/v1/chat/completions",
        json=chat("my private question"),
        headers={"authorization": "Bearer key-acme"},
    )
    assert response.status_code == 200
    assert await wait_for(lambda: _recipes_hold(store, b"my private question"))
    await first.stop()
    monkeypatch.delenv("PROMPTEDGE_CACHE_WARMING")  # warming switched off
    second = await start_router([replica.url], api_keys=KEYS, admin_key="admin-secret")
    deleted = await client.delete(
        second.url + "/cache", params={"tenant": "acme"}, headers={"authorization": "Bearer admin-secret"}
    )
    assert deleted.status_code == 200
    assert not await _recipes_hold(store, b"my private question"), (
        f"DELETE /cache?tenant=acme left acme's prompt in a warming recipe: {deleted.json()}"
    )


async def _recipes_hold(store, text: bytes) -> bool:  # noqa: F811
    for name in await store.keys(PREFIX + ":warm:recipe:*"):
        if any(text in raw for raw in (await store.hgetall(name)).values()):
            return True
    return False


async def test_an_entry_deleted_during_its_warm_generation_does_not_come_back(
    start_replica, start_router, client, store, warming
) -> None:  # noqa: F811
    """``DELETE /cache?tenant=acme`` answered while a warm generation of acme's prompt was in
    flight: the generation then stored the entry (and its mark) anyway, so acme's cache holds
    an answer after its deletion was acknowledged (e.g. a purge after a bad replica is undone
    by an answer from the same replica; the window is P2's ttfb_s, 60 s)."""
    warming()
    popularity = Popularity(store, PREFIX)
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    body = {**chat("What is a KV cache?"), "max_tokens": 600}  # 600 decode steps of 5 ms: 3 s
    for back in (1, 2):
        req = CacheRequest("chat.completions", body, "acme", pool=MODEL)
        assert await popularity.record(req, key_of(body), WarmingSettings(**WARMING), slot_start - back * 86400 + 1)
    await publish(store)
    router = await start_router([(await start_replica()).url], api_keys=KEYS, admin_key="admin-secret")

    async def started() -> bool:
        return await warm_count(client, router, "attempted") >= 1

    assert await wait_for(started)
    deleted = await client.delete(
        router.url + "/cache", params={"tenant": "acme"}, headers={"authorization": "Bearer admin-secret"}
    )
    assert deleted.status_code == 200
    await asyncio.sleep(4.0)  # the generation ends
    assert not await store.exists(key_of(body)), "acme's entry was stored after DELETE /cache?tenant=acme"


# --- the request a warm generation sends is the clients' own, not its canonical form ---


def _recording_replica(seen: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        seen.append(await request.json())
        return JSONResponse(
            {
                "id": "c",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    return app


@pytest.mark.parametrize(
    "params",
    [
        # vLLM fills a field the request leaves out from the model's generation_config.json
        # (--generation-config auto, its default): an explicit temperature 1.0 / top_p 1.0 /
        # repetition_penalty 1.0 is another sampling than none at all (e.g. Llama 3's 0.6 / 0.9)
        {"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0},
        # OpenAI-compatible upstreams that take only max_completion_tokens (reasoning models) refuse max_tokens
        {"max_completion_tokens": 8},
    ],
    ids=["explicit-defaults", "max_completion_tokens"],
)
async def test_a_warm_generation_sends_the_clients_parameters(
    start_router,
    client,
    store,
    warming,
    servers,  # noqa: F811
    params: dict,
) -> None:
    from tests.router.conftest import Served

    warming()
    seen: list[dict] = []
    replica = await Served(_recording_replica(seen)).start()
    servers.append(replica)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is a KV cache?"}], **params}
    popularity = Popularity(store, PREFIX)
    slot_start, _ = slot_bounds(time.time() + 120, 600)
    for back in (1, 2):  # what the router records for a client's stored miss with this body
        req = CacheRequest("chat.completions", body, "acme", pool=MODEL)
        assert await popularity.record(req, key_of(body), WarmingSettings(**WARMING), slot_start - back * 86400 + 1)
    await publish(store)
    await start_router([replica.url], api_keys=KEYS)
    assert await wait_for(lambda: store.exists(key_of(body)))
    assert seen, "no warm generation reached the replica"
    sent = {k: v for k, v in seen[-1].items() if k in params}
    assert sent == params, f"the clients sent {params}, the warmer sent {seen[-1]}"


# --- the lock goes to a worker that can warm ---


async def test_a_worker_whose_replicas_are_all_down_does_not_keep_the_pool_from_warming(
    start_replica, start_router, client, store, warming
) -> None:  # noqa: F811
    """The lock is taken (and renewed every tick, forever) before the worker looks at its pool:
    a router instance sharing the Redis whose replicas of the pool are all down (another zone,
    a discovery that lost them) holds it while it can never be idle (no capacity), and the
    instances that could warm never get it."""
    warming()
    await seed(store, ["What is a KV cache?"])
    dead = "http://127.0.0.1:9"  # nothing listens: never healthy
    await start_router([dead], api_keys=KEYS)
    await asyncio.sleep(0.5)  # it took the lock
    live = await start_router([(await start_replica()).url], api_keys=KEYS)
    warmed = await wait_for(lambda: store.exists(key_of(chat("What is a KV cache?"))), timeout_s=6.0)
    assert warmed, (
        f"the pool was never warmed (attempts by the live worker: {await warm_count(client, live, 'attempted')})"
    )


# --- shutdown: a cancel that a bounded Redis call swallows must still stop the warmer ---


@pytest.mark.parametrize("lost_as", ["timeout", "result"])
async def test_the_router_stops_when_a_cancel_is_lost_inside_a_warming_step(
    start_replica, start_router, warming, monkeypatch, lost_as: str
) -> None:  # noqa: F811
    """Full ``make test`` runs twice sat 30 s to 19 min in a warming router's shutdown, the event
    loop idle: ``Warmer.stop`` cancels each pool's task and waits for it, but a cancel that lands
    in a bounded await is lost on Python 3.11 (``asyncio.timeout`` turns it into the
    TimeoutError the warmer treats as Redis trouble, or ``wait_for`` returns the inner result
    that completed at the same moment), and ``PoolWarmer.run`` then loops forever. Here the
    step loses the first cancel in each of those two ways on purpose (later ones are honoured,
    as in the race, so that a failing run ends instead of hanging the test session)."""
    stepping = asyncio.Event()
    lost = 0

    async def step(self, settings) -> float:
        nonlocal lost
        stepping.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost:
                raise
            lost += 1
            if lost_as == "timeout":
                raise TimeoutError from None
        return 0.05

    monkeypatch.setattr(PoolWarmer, "step", step)
    warming()
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    await asyncio.wait_for(stepping.wait(), 10.0)
    stopping = asyncio.ensure_future(router.stop())
    done, _ = await asyncio.wait({stopping}, timeout=10.0)
    assert done, "the router's shutdown waited on a warming task that had lost its cancel"
