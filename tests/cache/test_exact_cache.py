"""ResponseCache against a real Redis: hits, misses, TTL, refusals, stats and Redis down."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache


def chat_response(text: str = "Redis is a data store.", finish: str | None = "stop") -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9},
    }


def request(content: str = "What is Redis?", tenant: str = "t1", **control: object) -> CacheRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return CacheRequest("chat.completions", body, tenant, CacheControl(**control))  # type: ignore[arg-type]


@pytest.fixture()
async def cache(redis_url: str):
    client = aioredis.Redis.from_url(redis_url)
    # the exact core alone; tests/cache/test_semantic_cache.py covers the semantic stage
    yield ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False))
    await client.aclose()


async def test_identical_repeat_hits_exactly_and_counts(cache: ResponseCache) -> None:
    assert await cache.lookup(request()) is None
    assert await cache.store(request(), chat_response())
    hit = await cache.lookup(request())
    assert hit is not None and hit.kind == "exact" and hit.similarity is None
    assert hit.response["choices"][0]["message"]["content"] == "Redis is a data store."
    stats = await cache.stats()
    assert (stats["requests"], stats["exact_hits"], stats["misses"]) == (2, 1, 1)
    assert stats["hit_ratio"] == 0.5
    assert stats["per_model"]["m"]["exact_hits"] == 1


async def test_replica_bytes_are_stored_as_is_and_served_on_a_hit(cache: ResponseCache) -> None:
    raw = json.dumps(chat_response(), indent=1).encode()  # as a replica may format it
    assert await cache.store(request(), chat_response(), raw)
    hit = await cache.lookup(request())
    assert hit is not None and hit.raw == raw and hit.response == chat_response()


async def test_exact_only_misses_are_each_counted_once(cache: ResponseCache) -> None:
    for _ in range(3):
        assert await cache.lookup(request()) is None
    stats = await cache.stats()
    assert (stats["requests"], stats["misses"]) == (3, 3)
    assert stats["windows"]["1m"]["per_tenant"]["t1"]["misses"] == 3


async def test_tenants_do_not_see_each_other(cache: ResponseCache) -> None:
    await cache.store(request(tenant="a"), chat_response())
    assert await cache.lookup(request(tenant="b")) is None


async def test_errors_and_partials_are_never_stored(cache: ResponseCache) -> None:
    assert not await cache.store(request(), {"error": {"message": "boom"}})
    assert not await cache.store(request(), chat_response(finish=None))
    assert not await cache.store(request(no_store=True), chat_response())
    assert await cache.lookup(request()) is None


async def test_no_cache_skips_lookup_but_stores(cache: ResponseCache) -> None:
    await cache.store(request(), chat_response())
    assert await cache.lookup(request(no_cache=True)) is None
    assert await cache.lookup(request()) is not None


async def test_entry_expires_at_fixed_ttl_even_when_popular(cache: ResponseCache) -> None:
    await cache.store(request(ttl_s=1), chat_response())
    deadline = time.monotonic() + 0.9
    while time.monotonic() < deadline:  # popular: read over and over
        assert await cache.lookup(request()) is not None
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.4)
    assert await cache.lookup(request()) is None


async def test_ttl_override_is_clamped(cache: ResponseCache) -> None:
    assert cache.ttl_for(request(ttl_s=10**9)) == cache.settings.max_ttl_s
    assert cache.ttl_for(request(ttl_s=0)) == cache.settings.min_ttl_s
    assert cache.ttl_for(request()) == cache.settings.ttl_s


async def test_corrupt_entry_is_skipped_and_counted(cache: ResponseCache, redis_url: str) -> None:
    await cache.store(request(), chat_response())
    client = aioredis.Redis.from_url(redis_url)
    [key] = await client.keys("promptedge:cache:exact:*")
    await client.set(key, b"{not json")
    await client.aclose()
    assert await cache.lookup(request()) is None
    assert cache._exact.corrupt == 1
    assert (await cache.stats())["rejected"] == {"corrupt": 1}


async def test_redis_down_gives_up_within_bound_and_reports_unhealthy() -> None:
    # Port 1 on loopback: nothing listens, connect fails at once or hangs; either way bounded.
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=5)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=0.05, semantic_enabled=False))
    started = time.monotonic()
    assert await cache.lookup(request()) is None
    assert not await cache.store(request(), chat_response())
    assert time.monotonic() - started < 1.0
    assert cache.healthy is False
    await client.aclose()


async def test_a_stalled_redis_is_bounded_without_a_socket_timeout() -> None:
    # The router gives the exact cache a client without socket timeout: every call must still
    # end within the cache's own bound when Redis accepts connections and never answers.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=0.05, semantic_enabled=False), bounded_redis=client)
    started = time.monotonic()
    assert await cache.lookup(request()) is None
    assert not await cache.store(request(), chat_response())
    assert time.monotonic() - started < 1.0
    assert cache.healthy is False
    await client.aclose()
    server.close()


async def test_a_slow_store_is_not_an_outage(redis_url: str) -> None:
    # Regression: stores were bounded by the lookup's 50 ms budget, so one slow write (seen in the
    # demo: SemanticStore.put under load) marked Redis down and lookups were skipped for a second.
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=0.05, semantic_enabled=False))
    real_set = cache._exact.set

    async def slow_set(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(0.2)  # slower than a lookup may take, well within a store's bound
        return await real_set(*args, **kwargs)

    cache._exact.set = slow_set  # type: ignore[method-assign]
    try:
        assert await cache.store(request(), chat_response())
        assert cache.healthy
        hit = await cache.lookup(request())
        assert hit is not None and hit.kind == "exact"
    finally:
        await client.aclose()


def test_an_answer_is_complete_only_with_every_choice_or_embedding_asked_for() -> None:
    # issue 12: n > 1 is cached whole or not at all; an embeddings list has one item per input
    from cache.exact import expected_choices, is_complete_response

    def chat(*indices: int) -> dict:
        return {
            "object": "chat.completion",
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"} for i in indices
            ],
        }

    assert expected_choices("chat.completions", {"n": 3}) == 3
    assert expected_choices("completions", {"n": 2, "prompt": ["a", "b"]}) == 4
    assert is_complete_response(chat(0, 1), 2) and not is_complete_response(chat(0), 2)
    assert not is_complete_response(chat(0, 0), 2) and is_complete_response(chat(0))
    embeddings = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [0.1]} for i in (0, 1)]}
    assert expected_choices("embeddings", {"input": ["a", "b"]}) == 2
    assert is_complete_response(embeddings, 2) and not is_complete_response(embeddings, 3)
    assert not is_complete_response({"object": "list", "data": []})
