"""Warming's records in a real Redis (cache/warming/popularity.py), written by ResponseCache:
what is counted, what is kept, for how long, and what never is."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache, exact_key
from cache.stats import metrics
from cache.warming.plan import slot_of
from cache.warming.popularity import Recipe, count_key, mark_key, recipe_key
from cache.warming.settings import WarmingSettings
from tests.cache.test_exact_cache import chat_response

NOW = 20 * 86400.0 + 12 * 3600 + 30  # day 20, slot 72 of 600 s
PREFIX = "promptedge:cache"


def request(content: str = "What is Redis?", tenant: str = "t1", **control: object) -> CacheRequest:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "user": "u-42",
        "temperature": 1.0,
        "max_completion_tokens": 8,
        "stream": True,
    }
    return CacheRequest("chat.completions", body, tenant, CacheControl(**control))  # type: ignore[arg-type]


def key_of(req: CacheRequest) -> str:
    return exact_key(PREFIX, req.endpoint, req.body, req.tenant, None, req.pool)


@pytest.fixture()
async def client(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


def make_cache(client: aioredis.Redis, **warming: object) -> ResponseCache:
    settings = CacheSettings(
        redis_timeout_s=1.0,
        semantic_enabled=False,
        warming={"m": WarmingSettings(**{"enabled": True, **warming})} if warming is not None else {},
    )
    return ResponseCache(client, settings, clock=lambda: NOW)


async def counted(client: aioredis.Redis, day: int = 20, slot: int = 72) -> dict[str, float]:
    members = await client.zrange(count_key(PREFIX, "m", day, slot), 0, -1, withscores=True)
    return {m.decode(): s for m, s in members}


async def warm_keys(client: aioredis.Redis) -> list[bytes]:
    return await client.keys(f"{PREFIX}:warm:*")


async def test_stored_misses_and_exact_hits_are_counted_with_a_recipe(client) -> None:
    cache = make_cache(client)
    req = request()
    assert await cache.store(req, chat_response())
    assert await cache.lookup(req) is not None
    await cache.aclose()  # waits for the hit's count
    key = key_of(req)
    assert slot_of(NOW, 600) == (20, 72)
    assert await counted(client) == {key: 2.0}
    raw = await client.hget(recipe_key(PREFIX, "m", 20, 72), key)
    recipe = Recipe.from_json(raw)
    # neutral fields are gone, the clients' parameters stay as sent, the key comes back out of the recipe
    assert "user" not in recipe.body and "stream" not in recipe.body and recipe.body["temperature"] == 1.0
    assert recipe.body["max_completion_tokens"] == 8 and "max_tokens" not in recipe.body
    assert recipe.tenant == "t1" and recipe.pool == "m"
    assert key_of(recipe.request()) == key
    ttl = await client.ttl(count_key(PREFIX, "m", 20, 72))
    assert 7 * 86400 < ttl <= 8 * 86400  # history_days + 1 days


async def test_warming_off_by_default_records_nothing(client) -> None:
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False), clock=lambda: NOW)
    req = request()
    assert await cache.store(req, chat_response())
    assert await cache.lookup(req) is not None
    await cache.aclose()
    assert await warm_keys(client) == []


async def test_another_pool_without_warming_records_nothing(client) -> None:
    cache = make_cache(client)
    req = CacheRequest("chat.completions", request().body, "t1", pool="other")
    assert await cache.store(req, chat_response())
    assert await cache.lookup(req) is not None
    await cache.aclose()
    assert await warm_keys(client) == []


async def test_answers_the_cache_refuses_are_never_counted(client) -> None:
    cache = make_cache(client)
    assert not await cache.store(request("a"), chat_response(finish=None))  # cut off
    assert not await cache.store(request("b"), {"error": {"message": "boom"}})
    assert not await cache.store(request("c", no_store=True), chat_response())
    await cache.store(request("d"), chat_response())
    assert await cache.lookup(request("d", no_store=True)) is not None  # a no-store hit: not kept
    await cache.aclose()
    assert await counted(client) == {key_of(request("d")): 1.0}


async def test_a_recipe_over_the_size_limit_is_not_counted(client) -> None:
    cache = make_cache(client, max_recipe_bytes=256)
    assert await cache.store(request("x" * 300), chat_response())
    assert await warm_keys(client) == []


async def test_each_slot_keeps_keep_per_slot_keys_and_their_recipes_only(client) -> None:
    cache = make_cache(client, top_k=1, keep_per_slot=2)
    for text, times in (("a", 3), ("b", 2), ("c", 1)):
        for _ in range(times):
            await cache.store(request(text), chat_response())
    kept = await counted(client)
    assert kept == {key_of(request("a")): 3.0, key_of(request("b")): 2.0}
    recipes = await client.hkeys(recipe_key(PREFIX, "m", 20, 72))
    assert sorted(r.decode() for r in recipes) == sorted(kept)


async def test_candidates_sum_earlier_days_and_read_the_entries_ttl(client) -> None:
    cache = make_cache(client, history_days=3, min_days_seen=1)
    warming = cache.settings.warming["m"]
    hot, once = request("hot"), request("once")
    for back in (1, 2, 3):  # "hot" on the three days before, "once" two days before
        cache.clock = lambda back=back: NOW - back * 86400
        await cache.store(hot, chat_response())
        if back == 2:
            await cache.store(once, chat_response())
    await client.delete(key_of(once))  # its entry is gone
    found = await cache.popularity.candidates("m", NOW - 30, warming, now_s=NOW)
    assert [(c.key, c.count, c.days_seen) for c in found] == [(key_of(hot), 3.0, 3), (key_of(once), 1.0, 1)]
    assert found[1].cached_until_s is None
    assert NOW + 3500 < found[0].cached_until_s <= NOW + 3600  # the entry's TTL (3600 s)
    recipe = await cache.popularity.recipe("m", key_of(hot), NOW - 30, warming)
    assert recipe is not None and recipe.key == key_of(hot)
    # slots of other times of day hold nothing for this one
    assert await cache.popularity.candidates("m", NOW + 600, warming, now_s=NOW) == []


async def test_warmed_entries_are_marked_and_their_hits_counted_apart(client) -> None:
    cache = make_cache(client)
    req = request()
    before = metrics.WARM_HITS.labels("m")._value.get()
    assert await cache.store(req, chat_response(), warmed=True)
    assert await counted(client) == {}  # a warm generation is no request
    assert await client.ttl(mark_key(PREFIX, key_of(req))) > 3500
    assert await cache.lookup(req) is not None
    await asyncio.gather(*cache._counting)
    assert metrics.WARM_HITS.labels("m")._value.get() == before + 1
    await cache.store(req, chat_response())  # a client's own miss replaces it
    assert not await client.exists(mark_key(PREFIX, key_of(req)))
    assert await cache.lookup(req) is not None
    await cache.aclose()
    assert metrics.WARM_HITS.labels("m")._value.get() == before + 1


def test_mark_key_keeps_the_entry_hash_tag() -> None:
    key = key_of(request())
    mark = mark_key(PREFIX, key)
    assert mark.split("{")[1].split("}")[0] == key.split("{")[1].split("}")[0]
    with pytest.raises(ValueError):
        mark_key("other", key)


def test_recipe_json_round_trips_and_rejects_garbage() -> None:
    recipe = Recipe("k", "chat.completions", "t", None, "m", {"model": "m"}, True, None)
    assert Recipe.from_json(recipe.to_json()) == recipe
    with pytest.raises(ValueError):
        Recipe.from_json(json.dumps({"key": "k"}))


async def test_delete_by_tenant_forgets_its_recipes_and_counts(client) -> None:
    cache = make_cache(client)
    mine, theirs = request("mine", tenant="t1"), request("theirs", tenant="t2")
    await cache.store(mine, chat_response())
    await cache.store(theirs, chat_response())
    assert await cache.delete(tenant="t1") == {"exact": 1, "semantic": 0, "warming": 1}
    assert await counted(client) == {key_of(theirs): 1.0}
    recipes = await client.hkeys(recipe_key(PREFIX, "m", 20, 72))
    assert [r.decode() for r in recipes] == [key_of(theirs)]


async def _scans(client: aioredis.Redis) -> int:
    return int((await client.info("commandstats")).get("cmdstat_scan", {}).get("calls", 0))


async def test_delete_does_not_walk_the_keyspace_to_find_warming_recipes(client) -> None:
    # DELETE /cache forgets warming's recipes even after warming was switched off; it found them
    # with a SCAN of the whole keyspace on every call, so every tenant deletion on a cache of
    # millions of entries paid a walk of all of them, warming used or not. The recipe hashes are
    # listed where they are created; a cache that never warmed reads an empty list.
    cold = make_cache(client, enabled=False)
    await cold.store(request("never warmed"), chat_response())
    before = await _scans(client)
    # tenant and model both named: the exact entries' owner list is read directly (no SCAN either)
    assert await cold.delete(tenant="t1", model="m") == {"exact": 1, "semantic": 0, "warming": 0}
    assert await _scans(client) == before
    warm = make_cache(client)
    await warm.store(request("warmed"), chat_response())
    before = await _scans(client)
    assert (await make_cache(client, enabled=False).delete(tenant="t1", model="m"))["warming"] == 1
    assert await _scans(client) == before
    assert await warm_keys(client) == []
