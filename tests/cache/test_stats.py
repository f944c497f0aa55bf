"""Cache counters: merging pending increments (pure) and writing them after the answer (real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

import cache.service
from cache import CacheSettings, ResponseCache
from cache.stats.store import BUCKET_S, LookupEvent, PendingCounts
from tests.cache.test_exact_cache import chat_response, request


def test_pending_counts_merge_per_bucket_and_survive_a_failed_write() -> None:
    pending = PendingCounts()
    t0 = 1_700_000_000.0  # a bucket boundary (divisible by 10)
    pending.add(LookupEvent("m", "a", "exact", tokens_saved=9, replica_s_saved=0.5), t0 + 1)
    pending.add(LookupEvent("m", "b", "miss"), t0 + 9.9)
    pending.add(
        LookupEvent(
            "m", "a", "semantic", similarity=0.975, tokens_saved=1, replica_s_saved=0.25, rejected=Counter(stale=2)
        ),
        t0 + BUCKET_S,
    )
    taken = pending.take()
    assert not pending
    assert sorted(taken) == [int(t0), int(t0) + BUCKET_S]
    ints, floats = taken[int(t0)]
    assert ints["*|requests"] == 2 and ints["*|exact_hits"] == 1 and ints["*|misses"] == 1
    assert ints["t=a|tokens_saved"] == 9 and "t=b|tokens_saved" not in ints
    assert floats == {"*|replica_s_saved": 0.5, "m=m|replica_s_saved": 0.5, "t=a|replica_s_saved": 0.5}
    later_ints, _ = taken[int(t0) + BUCKET_S]
    assert later_ints["*|sim:0.97"] == 1 and later_ints["*|reject:stale"] == 2

    pending.add(LookupEvent("m", "a", "exact", tokens_saved=1, replica_s_saved=0.5), t0 + 2)
    pending.restore(taken)
    again = pending.take()
    assert again[int(t0)][0]["*|requests"] == 3 and again[int(t0)][0]["t=a|tokens_saved"] == 10
    assert again[int(t0)][1]["*|replica_s_saved"] == 1.0


@pytest.fixture()
async def client(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


async def test_a_hit_is_answered_before_its_count_is_written(client: aioredis.Redis) -> None:
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False))
    assert await cache.lookup(request()) is None  # exact-only miss: counted with its GET
    assert await cache.store(request(), chat_response())
    release = asyncio.Event()
    real = cache._stats.record_pending

    async def held(taken: dict) -> None:
        await release.wait()
        await real(taken)

    cache._stats.record_pending = held  # type: ignore[method-assign]
    hit = await asyncio.wait_for(cache.lookup(request()), 5)  # would hang if it waited for the write
    assert hit is not None and hit.kind == "exact"
    release.set()
    stats = await cache.stats()
    assert (stats["requests"], stats["exact_hits"], stats["misses"], stats["tokens_saved"]) == (2, 1, 1, 9)


async def test_concurrent_hits_share_writes_and_all_are_counted(client: aioredis.Redis) -> None:
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False))
    assert await cache.store(request(), chat_response())
    writes = 0
    real = cache._stats.record_pending

    async def counted(taken: dict) -> None:
        nonlocal writes
        writes += 1
        await real(taken)

    cache._stats.record_pending = counted  # type: ignore[method-assign]
    hits = await asyncio.gather(*(cache.lookup(request()) for _ in range(50)))
    assert all(h is not None and h.kind == "exact" for h in hits)
    stats = await cache.stats()
    assert (stats["requests"], stats["exact_hits"], stats["tokens_saved"]) == (50, 50, 450)
    assert stats["windows"]["1m"]["exact_hits"] == 50
    assert 1 <= writes < 50


async def test_counts_are_kept_through_a_failed_write(client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.service, "_RETRY_AFTER_S", 0.05)
    cache_ = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False))
    assert await cache_.store(request(), chat_response())
    real = cache_._stats.record_pending
    failures = 0

    async def fails_once(taken: dict) -> None:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RedisConnectionError("connection reset")
        await real(taken)

    cache_._stats.record_pending = fails_once  # type: ignore[method-assign]
    assert await cache_.lookup(request()) is not None
    await cache_.flush_stats()
    assert failures == 1 and not cache_.healthy
    await asyncio.sleep(0.1)  # past the retry delay
    assert await cache_.lookup(request()) is not None
    stats = await cache_.stats()
    assert (stats["requests"], stats["exact_hits"]) == (2, 2)


async def test_a_write_that_fails_between_buckets_counts_each_lookup_once(client: aioredis.Redis) -> None:
    # A batch spanning a 10-second boundary is written bucket by bucket; when the second write
    # fails, only that bucket may be written again.
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, semantic_enabled=False))
    store = cache._stats
    real = store._record
    calls = 0

    async def second_fails(**kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RedisConnectionError("connection reset")
        return await real(**kwargs)

    store._record = second_fails  # type: ignore[method-assign]
    pending = PendingCounts()
    t0 = (int(time.time()) // BUCKET_S) * BUCKET_S
    pending.add(LookupEvent("m", "a", "miss"), t0 - BUCKET_S + 1)
    pending.add(LookupEvent("m", "a", "miss"), t0 + 1)
    taken = pending.take()
    with pytest.raises(RedisConnectionError):
        await store.record_pending(taken)
    assert sorted(taken) == [t0]  # the older bucket is in Redis, the newer one is not
    await store.record_pending(taken)
    stats = await store.read(now=t0 + 1)
    assert stats["requests"] == stats["misses"] == 2
    assert stats["windows"]["1m"]["requests"] == 2
