"""Attacks on warming's Redis records (cache/warming/popularity.py): regression tests for what a
security / SRE review found, in a real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from cache import CacheRequest, CacheSettings, ResponseCache
from cache.warming.popularity import Popularity, Recipe, count_key, recipe_key, slots_key
from cache.warming.settings import WarmingSettings
from tests.cache.test_exact_cache import chat_response

PREFIX = "promptedge:cache"
NOW = 20 * 86400.0 + 12 * 3600 + 30  # day 20, slot 72 of 600 s
MEMBERS = 9000  # over Lua's unpack limit (LUAI_MAXCSTACK, 8000); keep_per_slot allows 100,000


@pytest.fixture()
async def client(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


async def _fill(client: aioredis.Redis, tenant: str, n: int) -> None:
    """``n`` recipes and counts of ``tenant`` in one (day, slot) of pool m, as record() leaves them
    with keep_per_slot >= n (written in a pipeline: record() one by one takes long)."""
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        key = f"{PREFIX}:exact:{{0123456789abcdef}}:{i:064x}"
        body = {"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]}
        pipe.hset(
            recipe_key(PREFIX, "m", 20, 72),
            key,
            Recipe(key, "chat.completions", tenant, tenant, "m", body, True, None).to_json(),
        )
        pipe.zadd(count_key(PREFIX, "m", 20, 72), {key: 1})
    pipe.sadd(slots_key(PREFIX), recipe_key(PREFIX, "m", 20, 72))  # record() lists each new recipe hash
    await pipe.execute()


async def test_forget_deletes_a_slot_holding_more_recipes_than_lua_can_unpack(client) -> None:
    """``_FORGET_LUA`` passes every doomed member to one HDEL / ZREM with ``unpack(ARGV)``: over
    ~8000 members Redis answers "too many results to unpack", so the tenant's prompts cannot be
    deleted at all (DELETE /cache answers 503), with keep_per_slot >= 8000 (allowed: <= 100,000)."""
    await _fill(client, "acme", MEMBERS)
    deleted = await Popularity(client, PREFIX).forget("acme", None)
    assert deleted == MEMBERS
    assert await client.hlen(recipe_key(PREFIX, "m", 20, 72)) == 0


async def test_delete_by_tenant_does_not_mark_the_cache_down(client) -> None:
    """Through ResponseCache.delete the same script error is a Redis error of ``_bounded``: the
    whole cache is marked unavailable (every client's lookup a miss) and the deletion fails."""
    settings = CacheSettings(semantic_enabled=False, warming={"m": WarmingSettings(enabled=True, keep_per_slot=20000)})
    cache = ResponseCache(client, settings, clock=lambda: NOW)
    await _fill(client, "acme", MEMBERS)
    result = await cache.delete("acme", None)
    assert result["warming"] == MEMBERS
    assert cache.healthy


async def test_lowering_keep_per_slot_trims_without_a_script_error(client) -> None:
    """A slot filled under keep_per_slot 20,000 and then recorded into under keep_per_slot 100
    (a config change): ``_RECORD_LUA`` removes the 8,900 extra counts, then fails on
    ``HDEL unpack(gone)``; the recipes (prompts) of the removed counts stay behind, the request
    is not counted, and the cache is marked down by the error."""
    await _fill(client, "acme", MEMBERS)
    popularity = Popularity(client, PREFIX)
    body = {"model": "m", "messages": [{"role": "user", "content": "new one"}]}
    req = CacheRequest("chat.completions", body, "acme")
    from cache import exact_key

    assert await popularity.record(
        req, exact_key(PREFIX, "chat.completions", body, "acme"), WarmingSettings(enabled=True, keep_per_slot=100), NOW
    )
    assert await client.zcard(count_key(PREFIX, "m", 20, 72)) == 100
    assert await client.hlen(recipe_key(PREFIX, "m", 20, 72)) == 100


async def test_throwaway_keys_do_not_push_a_tenants_prompts_out_of_warming(client) -> None:
    """Review finding: every API key without a tenant mapping is a cache tenant of its own, and
    warming's fairness (trim the group holding the most, candidates round-robin over groups)
    counted each as a group. 30 keys sending one prompt each trimmed a mapped tenant's hot
    prompts to 1 of 10 and took 9 of 10 warming slots. They share one group now: their label."""
    from tests.cache.test_warming_popularity import key_of, make_cache, request

    cache = make_cache(client, keep_per_slot=20, top_k=10, history_days=1, min_days_seen=1)
    hot = [request(f"team question {i}", tenant="team-a") for i in range(10)]
    for req in hot:
        for _ in range(3):
            await cache.store(req, chat_response())
    for i in range(30):  # each its own scope (as classify.tenant makes them), all labelled "other"
        sybil = request(f"junk {i}", tenant=f"key:{i:016x}")
        await cache.store(
            CacheRequest(sybil.endpoint, sybil.body, sybil.tenant, sybil.control, tenant_label="other"), chat_response()
        )
    kept = {m.decode() for m in await client.zrange(count_key(PREFIX, "m", 20, 72), 0, -1)}
    assert {key_of(r) for r in hot} <= kept and len(kept) == 20
    # the next day's candidates for this slot: half the tenant's, half the throwaway keys'
    found = await cache.popularity.candidates("m", NOW + 86400 - 30, cache.settings.warming["m"], now_s=NOW)
    assert sum(c.key in {key_of(r) for r in hot} for c in found) == 5 and len(found) == 10
