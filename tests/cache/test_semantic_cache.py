"""ResponseCache with the semantic stage, on a real Redis and the real all-MiniLM-L6-v2.

Each test states the right answer for a kind of request the well-known semantic caches get
wrong (issue 3's regression list), plus the faults: Redis down, model missing, corrupt entry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache import CacheRequest, CacheSettings, ResponseCache
from cache.embed.encoder import Encoder
from tests.cache.helpers import Factory, answer, ask, started_caches

pytestmark = pytest.mark.slow

KITCHEN = "How do I turn on the lights in the kitchen?"
KITCHEN_PARAPHRASE = "How can I turn on the kitchen lights?"


@pytest.fixture()
async def make_cache(redis_url: str, encoder: Encoder) -> AsyncIterator[Factory]:
    """Builds started caches (one per simulated router worker) sharing the loaded model.
    Requests may loosen the threshold to 0 here: the scope and verification tests show what
    they block even then (the floor has its own test)."""
    async with started_caches(redis_url, encoder, min_request_threshold=0.0) as factory:
        yield factory


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 5.0) -> bool:
    """Poll until check() is true (cross-worker sync is asynchronous by design)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_paraphrase_hits_semantically_and_identical_repeat_hits_exactly(make_cache: Factory) -> None:
    cache = await make_cache()
    assert await cache.lookup(ask(KITCHEN)) is None
    assert await cache.store(ask(KITCHEN), answer())
    exact = await cache.lookup(ask(KITCHEN))
    assert exact is not None and exact.kind == "exact"
    hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
    assert hit is not None and hit.kind == "semantic"
    assert hit.similarity is not None and 0.95 <= hit.similarity <= 1.0
    assert hit.response["choices"][0]["message"]["content"] == "Flip the switch by the door."
    stats = await cache.stats()
    assert (stats["exact_hits"], stats["semantic_hits"], stats["misses"]) == (1, 1, 1)
    assert stats["per_tenant"]["t1"]["semantic_hits"] == 1
    assert stats["tokens_saved"] == 40 and stats["replica_seconds_saved"] > 0
    assert sum(stats["windows"]["1m"]["similarity_histogram"].values()) == 1


async def test_follow_up_questions_in_different_conversations_do_not_share(make_cache: Factory) -> None:
    cache = await make_cache(verifier="rules")  # the rules at 0.5 serve the paraphrase in its own conversation
    obama = ("Who is Barack Obama?", "The 44th president of the United States.")
    biden = ("Who is Joe Biden?", "The 46th president of the United States.")
    await cache.store(ask("How old is he?", history=obama), answer("He was born in 1961."))
    assert await cache.lookup(ask("How old is he?", history=biden)) is None
    assert await cache.lookup(ask("What is his age?", history=biden, threshold=0.0)) is None
    hit = await cache.lookup(ask("What is his age?", history=obama, threshold=0.5))
    assert hit is not None and hit.kind == "semantic"


async def test_same_question_under_another_system_prompt_does_not_share(make_cache: Factory) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN, system="Answer in English."), answer())
    assert await cache.lookup(ask(KITCHEN, system="Answer in French.")) is None
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE, system="Answer in French.", threshold=0.0)) is None


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("Turn on the lights in the living room", "Turn off the lights in the living room"),
        ("Allow guests to access the admin panel", "Deny guests access to the admin panel"),
    ],
)
async def test_opposite_instructions_do_not_share(make_cache: Factory, stored: str, asked: str) -> None:
    cache = await make_cache()
    await cache.store(ask(stored), answer())
    assert await cache.lookup(ask(asked, threshold=0.5)) is None
    stats = await cache.stats()
    assert stats["rejected"].get("opposite") == 1


async def test_tenants_never_see_each_others_entries(make_cache: Factory) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN, tenant="a"), answer())
    assert await cache.lookup(ask(KITCHEN, tenant="b")) is None
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE, tenant="b", threshold=0.0)) is None
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE, tenant="a")) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.2},
        {"max_tokens": 50},
        {"seed": 1},
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "lights", "parameters": {}}}]},
    ],
)
async def test_output_affecting_parameters_do_not_share(make_cache: Factory, change: dict[str, Any]) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN), answer())
    assert await cache.lookup(ask(KITCHEN, params=change)) is None
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE, params=change, threshold=0.0)) is None


async def test_missing_temperature_equals_explicit_one(make_cache: Factory) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN), answer())
    exact = await cache.lookup(ask(KITCHEN, params={"temperature": 1.0}))
    assert exact is not None and exact.kind == "exact"
    semantic = await cache.lookup(ask(KITCHEN_PARAPHRASE, params={"temperature": 1}))
    assert semantic is not None and semantic.kind == "semantic"


async def test_threshold_zero_means_zero_and_per_model_setting_applies(make_cache: Factory) -> None:
    cache = await make_cache(verifier="rules", model_thresholds={"m": 0.999})
    await cache.store(ask("What is a good recipe for pancakes?"), answer("Flour, eggs, milk."))
    assert await cache.lookup(ask("What is a good pancake recipe?")) is None  # the model's 0.999
    hit = await cache.lookup(ask("How do I make a quick breakfast?", threshold=0.0))
    assert hit is not None and hit.similarity is not None and hit.similarity < 0.9


async def test_a_request_cannot_loosen_the_threshold_below_the_floor(make_cache: Factory) -> None:
    # Issue 13, finding 4: X-Cache-Threshold 0 served an unrelated answer (similarity 0.15).
    strict = await make_cache(verifier="rules", min_request_threshold=None)  # the default: only stricter
    await strict.store(ask(KITCHEN), answer())
    assert await strict.lookup(ask("How do I bake bread at home?", threshold=0.0)) is None
    assert await strict.lookup(ask(KITCHEN_PARAPHRASE, threshold=1.0)) is None
    assert await strict.lookup(ask(KITCHEN_PARAPHRASE, threshold=0.0)) is not None  # raised to 0.96
    floor = await make_cache(verifier="rules", min_request_threshold=0.9)
    assert floor.settings.threshold_for("m", 0.0) == 0.9 and floor.settings.threshold_for("m", 0.97) == 0.97
    assert floor.settings.threshold_for("m") == 0.96
    assert CacheSettings(verifier="rules", min_request_threshold=0.99).threshold_for("m", 0.0) == 0.96  # never stricter
    # the default stage ("learned") works the same on its own threshold, the file's prefilter
    assert CacheSettings(min_request_threshold=0.99).threshold_for("m", 0.0) == 0.7


async def test_deleted_or_expired_entry_is_never_served_even_if_indexed(make_cache: Factory, redis_url: str) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN), answer())
    raw = aioredis.Redis.from_url(redis_url)
    [key] = await raw.keys("promptedge:cache:sem:entry:*")
    await raw.delete(key)  # behind the index's back: no stream event
    await raw.aclose()
    assert cache.semantic is not None and cache.semantic.index is not None and len(cache.semantic.index) == 1
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
    assert (await cache.stats())["rejected"]["stale"] == 1

    await cache.store(ask("What is Redis?", ttl_s=1), answer())
    assert await cache.lookup(ask("What is Redis exactly?")) is not None
    await asyncio.sleep(1.2)
    assert await cache.lookup(ask("What is Redis exactly?")) is None


async def test_popular_entry_still_expires_at_its_ttl(make_cache: Factory) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN, ttl_s=2), answer())
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is not None
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.8)
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None


async def test_two_workers_insert_and_look_up_concurrently_and_agree(make_cache: Factory) -> None:
    a, b = await make_cache(), await make_cache()
    questions = [f"What is the population of city number {i}?" for i in range(6)]
    await asyncio.gather(*((a if i % 2 else b).store(ask(q), answer(f"answer {i}")) for i, q in enumerate(questions)))

    async def both_serve_all() -> bool:
        for worker in (a, b):
            for i, q in enumerate(questions):
                hit = await worker.lookup(ask(q.replace("What is", "Tell me"), threshold=0.9))
                if hit is None or hit.response["choices"][0]["message"]["content"] != f"answer {i}":
                    return False
        return True

    assert await eventually(both_serve_all)
    assert a.semantic is not None and b.semantic is not None
    assert len(a.semantic.index) == len(b.semantic.index) == 6  # type: ignore[arg-type]
    deleted = await a.delete(tenant="t1")
    assert deleted["semantic"] == 6 and deleted["exact"] == 6
    # b's index may still hold the ids for a moment; Redis says no, so nothing is served
    assert await b.lookup(ask("Tell me the population of city number 3?", threshold=0.9)) is None
    assert await eventually(lambda: asyncio.sleep(0, len(b.semantic.index) == 0))  # type: ignore[arg-type, union-attr]
    await b.flush_stats()  # counts are written just after each answer; b's last one may be in flight
    stats_a, stats_b = await a.stats(), await b.stats()
    assert stats_a["requests"] == stats_b["requests"] > 0


async def test_a_new_worker_rebuilds_its_index_from_redis(make_cache: Factory) -> None:
    first = await make_cache()
    await first.store(ask(KITCHEN), answer())
    late = await make_cache()
    hit = await late.lookup(ask(KITCHEN_PARAPHRASE))
    assert hit is not None and hit.kind == "semantic"


async def test_entry_count_is_bounded_and_evicts_soonest_expiring(make_cache: Factory, redis_url: str) -> None:
    cache = await make_cache(max_entries=3)
    topics = ["volcanoes", "glaciers", "deserts", "rainforests"]
    for ttl, topic in zip([50, 10, 30, 40], topics):
        await cache.store(ask(f"Tell me about {topic}", ttl_s=ttl), answer(topic))
    raw = aioredis.Redis.from_url(redis_url)
    assert await raw.zcard("promptedge:cache:{sem}:expiry") == 3
    assert len(await raw.keys("promptedge:cache:sem:entry:*")) == 3
    await raw.aclose()
    assert cache.semantic is not None and len(cache.semantic.index) == 3  # type: ignore[arg-type]
    assert await cache.lookup(ask("Tell me something about glaciers", threshold=0.8)) is None
    assert await cache.lookup(ask("Tell me something about volcanoes", threshold=0.8)) is not None


async def test_corrupt_entry_is_skipped_counted_and_never_served(make_cache: Factory, redis_url: str) -> None:
    cache = await make_cache()
    await cache.store(ask(KITCHEN), answer())
    raw = aioredis.Redis.from_url(redis_url)
    [key] = await raw.keys("promptedge:cache:sem:entry:*")
    await raw.hset(key, "response", "{not json")
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
    assert (await cache.stats())["rejected"]["corrupt"] == 1
    assert not await raw.exists(key)
    await raw.aclose()


async def test_multimodal_and_tool_requests_are_cached_exactly_and_counted(make_cache: Factory) -> None:
    cache = await make_cache()
    parts = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    request = CacheRequest("chat.completions", {"model": "m", "messages": [{"role": "user", "content": parts}]}, "t1")
    assert await cache.lookup(request) is None
    assert await cache.store(request, answer("A cat."))
    hit = await cache.lookup(request)
    assert hit is not None and hit.kind == "exact"
    assert (await cache.stats())["semantic_skipped"] == {"non_text": 1}


async def test_embedding_model_that_fails_to_load_leaves_exact_cache_working(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, embedding_model="/nonexistent/model"))
    await cache.start()
    assert cache.semantic is not None and cache.semantic.state == "failed"
    assert cache.healthy is False
    await cache.store(ask(KITCHEN), answer())
    hit = await cache.lookup(ask(KITCHEN))
    assert hit is not None and hit.kind == "exact"
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
    assert (await cache.stats())["semantic_skipped"] == {"model_failed": 1}
    await cache.aclose()
    await client.aclose()


async def test_redis_down_lookups_give_up_within_the_bound(encoder: Encoder) -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=5)
    cache = ResponseCache(client, CacheSettings(redis_timeout_s=0.05), encoder=encoder)
    await cache.start()  # rebuild fails; the follower keeps retrying in the background
    started = time.monotonic()
    assert await cache.lookup(ask(KITCHEN)) is None
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
    assert not await cache.store(ask(KITCHEN), answer())
    assert time.monotonic() - started < 1.0
    assert cache.healthy is False
    await cache.aclose()
    await client.aclose()


async def test_a_slow_semantic_write_is_not_an_outage(redis_url: str, encoder: Encoder) -> None:
    # Regression: the semantic stage ran on the router's client, whose socket timeout (0.25 s in
    # the router) failed a slow semantic write under load; the cache was marked down for 1 s.
    # Here Redis answers through a proxy that holds replies 0.3 s while ``slow`` is set, and the
    # router-style client times out sockets at 0.1 s.
    from urllib.parse import urlparse

    target = urlparse(redis_url)
    slow = False

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port or 6379)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delayed: bool) -> None:
            while data := await src.read(65536):
                if delayed and slow:
                    await asyncio.sleep(0.3)
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True), return_exceptions=True)

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/{(target.path or '/0').lstrip('/') or '0'}"
    router_client = aioredis.Redis.from_url(url, socket_timeout=0.1, socket_connect_timeout=0.1)
    cache_client = aioredis.Redis.from_url(url)
    cache = ResponseCache(
        router_client,
        CacheSettings(redis_timeout_s=0.05, embed_timeout_s=10.0),
        encoder=encoder,
        bounded_redis=cache_client,
    )
    await cache.start()
    try:
        slow = True
        assert await cache.store(ask(KITCHEN), answer())  # each write waits 0.3 s: within a store's 1 s
        slow = False
        assert cache.healthy
        hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
        assert hit is not None and hit.kind == "semantic"
    finally:
        await cache.aclose()
        await router_client.aclose()
        await cache_client.aclose()
        server.close()


async def test_close_returns_even_if_a_read_swallows_the_follower_cancellation(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The teardown of make_cache hung for ever (after the floor test): close() cancelled the
    # index follower while redis-py was reading an XREAD reply, the read absorbed the
    # CancelledError (retried the command) and the follower's while-True loop went on, so
    # `await task` in close() never returned. A read that swallows a cancel stands in for it.
    from cache.semantic.cache import SemanticCache
    from cache.semantic.index import ScopedIndex
    from cache.semantic.store import SemanticStore

    swallowed: list[bool] = []

    async def swallowing_read(self: SemanticStore, after: str, block_ms: int, count: int = 512) -> list[Any]:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # what the library did once: the cancel never reaches the follower
        return []

    monkeypatch.setattr(SemanticStore, "read_events", swallowing_read)
    semantic = SemanticCache(aioredis.Redis.from_url(redis_url), CacheSettings())
    semantic.index = ScopedIndex(4, max_entries=10)
    semantic._follow_client = aioredis.Redis.from_url(redis_url)
    semantic._follower = asyncio.create_task(semantic._follow())
    await asyncio.sleep(0.01)
    started = time.monotonic()
    # before the fix close() waited until this bound's own cancel reached the follower
    async with asyncio.timeout(3):
        await semantic.close()
    assert time.monotonic() - started < 2 and swallowed == [True]
    assert semantic._follower.cancelled()
    await semantic._redis.aclose()


async def test_learned_verifier_serves_a_rewording_and_rejects_a_near_miss(make_cache: Factory) -> None:
    cache = await make_cache(verifier="learned", semantic_precision_target=0.90)
    await cache.store(ask("Who won round 1 of the debate?"), answer("Candidate A."))
    near_miss = await cache.lookup(ask("Who won round 2 of the debate?"))
    assert near_miss is None  # similar by cosine, another question: the numbers rule vetoes it
    stats = await cache.stats()
    assert stats["rejected"].get("number") == 1 and not stats["rejected"].get("learned")
    # a near-miss no rule catches is the verifier's to refuse, counted "learned"
    await cache.store(ask("How do I become a good writer?"), answer("Write every day."))
    assert await cache.lookup(ask("How do I become a good editor?")) is None  # cosine 0.76
    assert (await cache.stats())["rejected"].get("learned") == 1
    await cache.store(ask("How do I become a better software engineer in my current job?"), answer("Practice daily."))
    hit = await cache.lookup(ask("How can I become a better software engineer at my current job?"))
    assert hit is not None and hit.kind == "semantic"
    assert hit.response["choices"][0]["message"]["content"] == "Practice daily."


async def test_the_default_stage_serves_a_paraphrase_the_rules_threshold_would_refuse(make_cache: Factory) -> None:
    # issue 34: the default ("learned" with the rules' vetoes) serves this pair at cosine 0.954,
    # below the rules' 0.96; the rules alone refuse it, and a veto still refuses a near-miss
    learned = await make_cache(min_request_threshold=None)
    assert learned.settings.verifier == "learned"
    await learned.store(ask("Why is the sky blue?"), answer("Rayleigh scattering."))
    hit = await learned.lookup(ask("Why does the sky look blue?"))
    assert hit is not None and hit.kind == "semantic" and hit.similarity is not None and hit.similarity < 0.96
    assert await learned.lookup(ask("Why is the sky not blue?")) is None
    rules = await make_cache(verifier="rules", min_request_threshold=None, key_prefix="promptedge:rules")
    await rules.store(ask("Why is the sky blue?"), answer("Rayleigh scattering."))
    assert await rules.lookup(ask("Why does the sky look blue?")) is None
