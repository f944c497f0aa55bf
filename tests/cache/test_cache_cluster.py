"""The response cache on a real local Redis Cluster (three masters, tests/conftest.py): exact and
semantic entries, deletes by tenant/model, the stats counters, and the index followed by a
second worker. Every Lua script and transaction must touch one slot, or Redis Cluster refuses it
with CROSSSLOT (the cache would then silently serve nothing: a store returns False)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from cache import CacheRequest, CacheSettings, ResponseCache
from cache.embed.encoder import Encoder
from cache.verify.bound.model import BoundPrior
from cache.verify.bound.store import pool_name
from opskit.redis_client import async_redis
from sim.stack.redis_topology import LocalCluster

pytestmark = pytest.mark.redis_ha


def answer(text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{abs(hash(text))}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def ask(text: str, tenant: str = "t1", model: str = "m", **params: Any) -> CacheRequest:
    return CacheRequest(
        "chat.completions", {"model": model, "messages": [{"role": "user", "content": text}], **params}, tenant
    )


Factory = Callable[..., Awaitable[ResponseCache]]


@pytest.fixture()
async def make_cache(cluster_url: str) -> AsyncIterator[Factory]:
    """Started caches on the cluster, each with its own clients (one per simulated worker)."""
    made: list[tuple[ResponseCache, list[Any]]] = []

    async def factory(encoder: Encoder | None = None, **overrides: Any) -> ResponseCache:
        clients = [async_redis(cluster_url), async_redis(cluster_url, socket_timeout=6)]
        settings = CacheSettings(
            **{"redis_timeout_s": 2.0, "embed_timeout_s": 10.0, "semantic_enabled": encoder is not None, **overrides}
        )
        cache = ResponseCache(clients[0], settings, encoder=encoder, follow_redis=clients[1])
        await cache.start()
        made.append((cache, clients))
        return cache

    yield factory
    for cache, clients in made:
        await cache.aclose()
        for client in clients:
            await client.aclose()


def nodes_holding_keys(cluster: LocalCluster) -> int:
    count = 0
    for port in cluster.ports:
        with redis.Redis(port=port) as node:
            count += node.dbsize() > 0
    return count


async def test_exact_entries_store_hit_spread_and_delete_by_tenant_and_model(
    make_cache: Factory, redis_cluster: LocalCluster
) -> None:
    cache = await make_cache()
    scopes = [(f"tenant-{i}", model) for i in range(6) for model in ("m1", "m2")]
    for tenant, model in scopes:
        assert await cache.store(ask("hi", tenant, model), answer(f"{tenant}/{model}")) is True
    for tenant, model in scopes:
        hit = await cache.lookup(ask("hi", tenant, model))
        assert hit is not None and hit.kind == "exact"
        assert hit.response["choices"][0]["message"]["content"] == f"{tenant}/{model}"  # its own, no other's
    assert nodes_holding_keys(redis_cluster) >= 2  # scopes spread over the masters
    assert await cache.delete(tenant="tenant-0") == {"exact": 2, "semantic": 0}
    assert await cache.delete(model="m2") == {"exact": 5, "semantic": 0}  # on every node (SCAN per primary)
    assert await cache.lookup(ask("hi", "tenant-0", "m1")) is None
    assert await cache.lookup(ask("hi", "tenant-3", "m2")) is None
    assert (await cache.lookup(ask("hi", "tenant-3", "m1"))) is not None
    assert await cache.delete() == {"exact": 5, "semantic": 0}
    assert await cache.lookup(ask("hi", "tenant-3", "m1")) is None


async def test_stats_counters_add_up_on_the_cluster(make_cache: Factory) -> None:
    cache = await make_cache()
    await cache.store(ask("a"), answer("a"))
    for text in ("a", "a", "b"):
        await cache.lookup(ask(text))
    stats = await cache.stats()
    assert (stats["requests"], stats["exact_hits"], stats["misses"]) == (3, 2, 1)
    assert stats["windows"]["1m"]["requests"] == 3
    assert cache.healthy


@pytest.mark.slow
async def test_semantic_entries_are_stored_followed_evicted_and_deleted_on_the_cluster(
    make_cache: Factory, encoder: Encoder
) -> None:
    first = await make_cache(encoder, max_entries=3)
    second = await make_cache(encoder, max_entries=3)  # another worker: learns entries from the stream
    assert await first.store(ask("How do I turn on the lights in the kitchen?"), answer("switch")) is True
    paraphrase = ask("How can I turn on the kitchen lights?")
    hit = None
    for _ in range(100):
        hit = await second.lookup(paraphrase)
        if hit is not None:
            break
        await asyncio.sleep(0.05)
    assert hit is not None and hit.kind == "semantic" and hit.response["choices"][0]["message"]["content"] == "switch"
    for i, text in enumerate(["What is the capital of France?", "How tall is Mount Everest?", "Who wrote Hamlet?"]):
        assert await first.store(ask(text, tenant="t2"), answer(f"t2-{i}")) is True
    # max_entries 3: the fourth entry evicted one of the larger tenant group (t2 holds 3 of 4)
    assert (await first.lookup(ask("How can I turn on the kitchen lights?"))) is not None
    assert (await first.delete(tenant="t1"))["semantic"] == 1
    for _ in range(100):  # the other worker drops it through the stream's `del`
        if await second.lookup(paraphrase) is None:
            break
        await asyncio.sleep(0.05)
    assert await second.lookup(paraphrase) is None
    assert first.healthy and second.healthy


async def test_a_label_counts_once_per_entry_and_query_on_the_cluster(
    make_cache: Factory, encoder: Encoder, tmp_path: Path
) -> None:
    # the pair's marker and its pool's counts are written by one script: one slot, or CROSSSLOT
    path = tmp_path / "prior.json"
    path.write_text(
        json.dumps(
            BoundPrior("cosine", 0.70, (0.70, 0.80), (0.30, 0.97), (1e6, 1e6), offset_var=1.0, source="clean").to_json()
        )
    )
    cache = await make_cache(encoder, verifier="rules", error_bound=0.05, bound_prior_path=path)
    greedy = {"temperature": 0}
    assert await cache.store(ask("How do I turn on the lights in the kitchen?", **greedy), answer("switch"))
    request = ask("How can I turn on the kitchen lights?", **greedy)
    hit = await cache.lookup(request)
    assert hit is not None and hit.kind == "semantic"
    assert [await cache.verify_hit(request, hit, answer("switch")) for _ in range(3)] == [True, None, None]
    assert cache.semantic is not None and cache.semantic.bound is not None
    assert (await cache.semantic.bound.pool(pool_name("t1", "m"))).seen == 1
    assert cache.healthy


async def test_warming_records_trims_and_forgets_on_the_cluster(make_cache: Factory) -> None:
    """Warming's record script touches five keys of one (pool, day, slot), its forget script the
    same five: one hash tag, or CROSSSLOT. Trimming, candidates and delete by tenant work there."""
    from cache.warming.popularity import group_tag
    from cache.warming.settings import WarmingSettings

    now = 20 * 86400.0 + 12 * 3600 + 30
    cache = await make_cache(
        warming={"m": WarmingSettings(enabled=True, keep_per_slot=4, top_k=4, history_days=1, min_days_seen=1)}
    )
    cache.clock = lambda: now
    for i in range(3):
        for _ in range(2):
            assert await cache.store(ask(f"team question {i}", tenant="acme"), answer("a"))
    for i in range(5):  # each its own tenant, all labelled other: one fairness group
        req = ask(f"junk {i}", tenant=f"key:{i:016x}")
        assert await cache.store(CacheRequest(req.endpoint, req.body, req.tenant, tenant_label="other"), answer("b"))
    # four kept: over the limit the group holding the most loses its lowest, so 2 and 2
    found = await cache.popularity.candidates("m", now + 86400 - 30, cache.settings.warming["m"], now_s=now)
    groups = [c.group for c in found]
    assert sorted(groups) == sorted([group_tag("acme")] * 2 + [group_tag("other")] * 2)
    result = await cache.delete("acme", None)
    assert result["warming"] == 2
