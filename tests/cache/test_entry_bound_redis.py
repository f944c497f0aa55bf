"""The per-entry error bound inside ResponseCache, on a real Redis and the real encoder: the
decision on the lookup path, the hit record a client may report, and the report's scope (the
tenant that received the hit, once; the entry only, never the pool)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache
from cache.embed.encoder import Encoder
from cache.keys import digest, entry_key
from cache.semantic.scope import SemanticQuery, semantic_query
from cache.verify.bound.model import BoundPrior, EntryState, load_prior
from cache.verify.bound.store import BoundStore, pool_name
from tests.cache.helpers import answer, ask

pytestmark = pytest.mark.slow

KITCHEN = "How do I turn on the lights in the kitchen?"
KITCHEN_PARAPHRASE = "How can I turn on the kitchen lights?"
# the traffic is known to be clean above cosine 0.80 (P(right) 0.97, a million pairs a step)
CLEAN = BoundPrior("cosine", 0.70, (0.70, 0.80), (0.30, 0.97), (1e6, 1e6), offset_var=1.0, source="clean")


@pytest.fixture()
async def bounded_cache(redis_url: str, encoder: Encoder, tmp_path: Path) -> AsyncIterator[ResponseCache]:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(CLEAN.to_json()))
    client = aioredis.Redis.from_url(redis_url)
    settings = CacheSettings(
        redis_timeout_s=1.0,
        embed_timeout_s=10.0,
        verifier="rules",  # the cosine prior judges the rules' choice
        error_bound=0.05,
        feedback=True,
        bound_prior_path=path,
    )
    cache = ResponseCache(client, settings, encoder=encoder)
    await cache.start()
    yield cache
    await cache.aclose()
    await client.aclose()


async def test_a_reported_hit_makes_its_entry_stricter_for_its_tenant_only_once(bounded_cache: ResponseCache) -> None:
    cache = bounded_cache
    assert await cache.store(ask(KITCHEN), answer())
    assert await cache.store(ask(KITCHEN, tenant="t2"), answer())
    hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
    assert hit is not None and hit.kind == "semantic" and hit.feedback_id is not None
    assert hit.similarity is not None and hit.similarity >= 0.80
    # another tenant cannot report it, nor can a made-up id; neither uses the report up
    assert not await cache.report_wrong(hit.feedback_id, "t2")
    assert not await cache.report_wrong("0" * 32, "t1")
    assert await cache.report_wrong(hit.feedback_id, "t1")
    assert not await cache.report_wrong(hit.feedback_id, "t1")  # once
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound: BoundStore = cache.semantic.bound
    stored = await cache._client.hget(hit.key, "bound")  # noqa: SLF001 - the entry's state in Redis
    state = EntryState.from_json(json.loads(stored))
    assert state.seen == 1 and state.wrong == 1 and state.mean < -0.5
    assert (await bound.pool(pool_name("t1", "m"))).seen == 0  # a client's report never teaches the pool
    # the same paraphrase is now a miss for t1 (counted), still a hit for t2's own entry
    assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
    assert (await cache.lookup(ask(KITCHEN_PARAPHRASE, tenant="t2"))) is not None
    stats = await cache.stats()
    assert stats["rejected"].get("bound") == 1


async def test_a_report_on_an_entry_that_is_gone_is_not_applied_and_does_not_recreate_it(
    bounded_cache: ResponseCache,
) -> None:
    cache = bounded_cache
    assert await cache.store(ask(KITCHEN), answer())
    hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
    assert hit is not None and hit.feedback_id is not None
    await cache.delete(tenant="t1")
    assert not await cache.report_wrong(hit.feedback_id, "t1")
    assert not await cache._client.exists(hit.key)  # noqa: SLF001


async def test_the_shipped_prior_does_not_serve_a_paraphrase_at_5_percent(redis_url: str, encoder: Encoder) -> None:
    # QQP's train split never shows 95 % right answers at any cosine (its top step is 0.899):
    # with the shipped prior and no labels, a 0.05 bound serves nothing semantic
    assert load_prior().probability[-1] < 0.95
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(
        client,
        CacheSettings(redis_timeout_s=1.0, embed_timeout_s=10.0, verifier="rules", error_bound=0.05),
        encoder=encoder,
    )
    await cache.start()
    try:
        assert await cache.store(ask(KITCHEN), answer())
        assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
        exact = await cache.lookup(ask(KITCHEN))
        assert exact is not None and exact.kind == "exact" and exact.feedback_id is None
    finally:
        await cache.aclose()
        await client.aclose()


def test_settings_refuse_feedback_without_a_bound_and_a_bad_prior(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="FEEDBACK needs"):
        CacheSettings(feedback=True)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValidationError, match="bad.json"):
        CacheSettings(error_bound=0.02, bound_prior_path=bad)
    with pytest.raises(ValidationError):
        CacheSettings(error_bound=0.0)
    assert CacheSettings(error_bound=0.02).bound_prior() is not None
    assert CacheSettings().bound_prior() is None


def greedy(text: str, tenant: str = "t1", temperature: float | None = 0.0) -> CacheRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if temperature is not None:
        body["temperature"] = temperature
    return CacheRequest("chat.completions", body, tenant, CacheControl())


@pytest.fixture()
async def exploring(redis_url: str, encoder: Encoder, tmp_path: Path) -> AsyncIterator[tuple[ResponseCache, Any]]:
    """A cache at delta 0.01 on the clean prior, so a paraphrase's candidate is explored (not
    served) and the replica's answer labels it; with its Redis client."""
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(CLEAN.to_json()))
    client = aioredis.Redis.from_url(redis_url)
    cache = ResponseCache(
        client,
        CacheSettings(
            redis_timeout_s=1.0, embed_timeout_s=10.0, verifier="rules", error_bound=0.01, bound_prior_path=path
        ),
        encoder=encoder,
    )
    await cache.start()
    assert cache.semantic is not None and cache.semantic.bound is not None
    yield cache, client
    await cache.aclose()
    await client.aclose()


async def test_a_compared_miss_labels_the_explored_entry_and_the_pool(exploring: tuple[ResponseCache, Any]) -> None:
    # delta 0.01: the clean prior's 0.97 is not enough, so the paraphrase's candidate is
    # explored; the replica's answer then says whether the cached one was right
    cache, client = exploring
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound = cache.semantic.bound
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    assert await cache.lookup(greedy(KITCHEN_PARAPHRASE)) is None  # explored, not served
    assert await cache.store(greedy(KITCHEN_PARAPHRASE), answer("Flip the switch."))  # same answer: right
    pool = await bound.pool(pool_name("t1", "m"))
    assert pool.seen == 1 and sum(pool.right) == 1
    key = cache.semantic.store.prefix + ":sem:entry:{"  # the stored KITCHEN entry's state
    states = [json.loads(v) for k in await client.keys(key + "*") if (v := await client.hget(k, "bound")) is not None]
    assert [(s["n"], s["w"]) for s in states] == [(1, 0)] and states[0]["m"] > 0
    # a sampled request proves nothing: no label
    assert await cache.lookup(greedy("How could I switch on the kitchen lights?", temperature=None)) is None
    assert await cache.store(greedy("How could I switch on the kitchen lights?", temperature=None), answer("x"))
    assert (await bound.pool(pool_name("t1", "m"))).seen == 1
    # another answer from the replica: the cached one would have been wrong
    assert await cache.lookup(greedy("Kitchen lights: how do I turn them on?")) is None
    assert await cache.store(greedy("Kitchen lights: how do I turn them on?"), answer("Use the app."))
    assert sum((await bound.pool(pool_name("t1", "m"))).wrong) == 1


async def test_one_tenants_compared_misses_do_not_loosen_another_tenants_pool(
    exploring: tuple[ResponseCache, Any],
) -> None:
    # Regression (attack round, 3 December): the pool's counts were per model, shared by every
    # tenant, so a tenant sending greedy prompts with identical answers raised every step's
    # right-count and other tenants then got hits for different questions at cosine ~0.75.
    cache, _ = exploring
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound = cache.semantic.bound
    assert await cache.store(greedy(KITCHEN, tenant="attacker"), answer("OK"))
    assert await cache.lookup(greedy(KITCHEN_PARAPHRASE, tenant="attacker")) is None  # explored
    assert await cache.store(greedy(KITCHEN_PARAPHRASE, tenant="attacker"), answer("OK"))  # right
    assert (await bound.pool(pool_name("attacker", "m"))).seen == 1  # its own pool learned
    for other in (pool_name("victim", "m"), "m"):  # nobody else's, nor a per-model one
        assert (await bound.pool(other)).seen == 0


async def test_a_verified_hit_labels_its_entry_and_pool_as_a_compared_miss_does(bounded_cache: ResponseCache) -> None:
    # shadow verification (the router asks a replica after serving the hit): the replica's own
    # answer labels the entry that answered and its tenant's pool, through the same code path
    cache = bounded_cache
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound, pool = cache.semantic.bound, pool_name("t1", "m")
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    request = greedy(KITCHEN_PARAPHRASE)
    hit = await cache.lookup(request)
    assert hit is not None and hit.kind == "semantic" and hit.entry_id is not None
    assert await cache.verify_hit(request, hit, answer("Flip the switch.")) is True
    other = greedy("How can I switch on the kitchen lights?")  # another query: its own label
    other_hit = await cache.lookup(other)
    assert other_hit is not None and other_hit.entry_id == hit.entry_id
    assert await cache.verify_hit(other, other_hit, answer("Use the app.")) is False
    state = await bound.pool(pool)
    assert (sum(state.right), sum(state.wrong)) == (1, 1)
    entry = EntryState.from_json(json.loads(await cache._client.hget(hit.key, "bound")))  # noqa: SLF001
    assert (entry.seen, entry.wrong) == (2, 1)
    # no label for a sampled request, nor for an exact hit (no entry state to teach)
    sampled = greedy(KITCHEN_PARAPHRASE, temperature=None)
    assert await cache.verify_hit(sampled, hit, answer("Use the app.")) is None
    exact = await cache.lookup(greedy(KITCHEN))
    assert exact is not None and exact.kind == "exact" and exact.entry_id is None
    assert await cache.verify_hit(greedy(KITCHEN), exact, answer("Use the app.")) is None
    assert (await bound.pool(pool)).seen == 2


async def seen(cache: ResponseCache, key: str) -> int:
    """How many labels the entry at ``key`` has taken (0: never labelled)."""
    raw = await cache._client.hget(key, "bound")  # noqa: SLF001 - the entry's state in Redis
    return 0 if raw is None else EntryState.from_json(json.loads(raw)).seen


async def test_the_same_query_verified_40_times_is_one_label(bounded_cache: ResponseCache) -> None:
    # Regression (attack round, 3 December): with SHADOW_RATE=1 one client sent the same
    # paraphrase 40 times, each hit was verified and labelled, and the pool's step counted 40
    # "independent" rights (twice the shipped prior's weight) for one (entry, query) pair.
    cache = bounded_cache
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound, pool = cache.semantic.bound, pool_name("t1", "m")
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    labels = []
    for _ in range(40):
        request = greedy(KITCHEN_PARAPHRASE)
        hit = await cache.lookup(request)
        assert hit is not None and hit.kind == "semantic"
        labels.append(await cache.verify_hit(request, hit, answer("Flip the switch.")))
    assert labels == [True] + [None] * 39  # a repeat gives no label (the router's ``no_label``)
    state = await bound.pool(pool)
    assert (sum(state.right), sum(state.wrong)) == (1, 0)
    assert await seen(cache, hit.key) == 1
    # the query's text as the encoder reads it (case, spacing) is the same query
    again = greedy("  how can I turn ON the kitchen   lights? ")
    again_hit = await cache.lookup(again)
    assert again_hit is not None and again_hit.entry_id == hit.entry_id
    assert await cache.verify_hit(again, again_hit, answer("Use the app.")) is None
    assert (await bound.pool(pool)).seen == 1


async def test_the_same_query_compared_40_times_is_one_label(exploring: tuple[ResponseCache, Any]) -> None:
    # Compared misses go through the same ``_learn``: the same greedy query explored while the
    # bound declines to serve (its exact entry gone meanwhile, e.g. a short TTL) is one label.
    cache, _ = exploring
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound, pool = cache.semantic.bound, pool_name("t1", "m")
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    request = greedy(KITCHEN_PARAPHRASE)
    assert await cache.lookup(request) is None  # explored, not served
    explored = cache._explored[request.digest]  # noqa: SLF001 - what each repeated lookup leaves
    entry_id = explored[0]
    for _ in range(40):
        cache._explored[request.digest] = explored  # noqa: SLF001
        assert await cache.store(request, answer("Flip the switch."))
    state = await bound.pool(pool)
    assert (sum(state.right), sum(state.wrong)) == (1, 0)
    assert await seen(cache, cache.semantic.store.prefix + ":sem:entry:{" + entry_id + "}") == 1


async def test_different_queries_on_one_entry_each_count(bounded_cache: ResponseCache) -> None:
    cache = bounded_cache
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound, pool = cache.semantic.bound, pool_name("t1", "m")
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    entries = set()
    for text in (KITCHEN_PARAPHRASE, "How can I switch on the kitchen lights?", "How do I turn the kitchen lights on?"):
        request = greedy(text)
        hit = await cache.lookup(request)
        assert hit is not None and hit.kind == "semantic", text
        entries.add(hit.key)
        assert await cache.verify_hit(request, hit, answer("Flip the switch.")) is True
    assert len(entries) == 1
    assert (await bound.pool(pool)).seen == 3
    assert await seen(cache, entries.pop()) == 3


async def test_one_query_on_two_entries_counts_for_each(bounded_cache: ResponseCache) -> None:
    cache = bounded_cache
    assert cache.semantic is not None and cache.semantic.bound is not None
    bound, pool = cache.semantic.bound, pool_name("t1", "m")
    assert await cache.store(greedy(KITCHEN), answer("Flip the switch."))
    second = "How do I switch on the lights in my kitchen?"
    assert await cache.store(greedy(second), answer("Flip the switch."))
    request = greedy(KITCHEN_PARAPHRASE)
    hit = await cache.lookup(request)
    assert hit is not None and hit.kind == "semantic" and hit.entry_id is not None
    # the other entry, as a lookup that found it would have served it
    query = semantic_query("chat.completions", greedy(KITCHEN).body, "t1")
    assert isinstance(query, SemanticQuery)
    ids = {digest([query.scope, text])[:32] for text in (KITCHEN, second)}
    other_id = (ids - {hit.entry_id}).pop()
    other = dataclasses.replace(hit, entry_id=other_id, key=entry_key(cache.settings.key_prefix, other_id))
    assert await cache.verify_hit(request, hit, answer("Flip the switch.")) is True
    assert await cache.verify_hit(request, other, answer("Flip the switch.")) is True
    assert (await bound.pool(pool)).seen == 2
    assert [await seen(cache, h.key) for h in (hit, other)] == [1, 1]


def test_settings_bound_the_shadow_share_and_budget() -> None:
    with pytest.raises(ValidationError, match="SHADOW_RATE needs"):
        CacheSettings(shadow_rate=0.1)
    for bad in ({"shadow_rate": 1.5}, {"shadow_rate": -0.1}, {"shadow_max_inflight": 0}):
        with pytest.raises(ValidationError):
            CacheSettings(error_bound=0.02, **bad)
    settings = CacheSettings(error_bound=0.02, shadow_rate=0.05)
    assert (settings.shadow_rate, settings.shadow_max_inflight) == (0.05, 2)
    assert CacheSettings().shadow_rate == 0


# issue 34: the bound on the learned verifier's calibrated probability; the traffic is known to
# be clean above probability 0.6 (P(right) 0.97, a million pairs a step)
CLEAN_LEARNED = BoundPrior("learned", 0.5, (0.5, 0.6), (0.30, 0.97), (1e6, 1e6), offset_var=1.0, source="clean")


async def test_the_bound_serves_on_the_learned_verifiers_probability(
    redis_url: str, encoder: Encoder, tmp_path: Path
) -> None:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(CLEAN_LEARNED.to_json()))
    client = aioredis.Redis.from_url(redis_url)
    settings = CacheSettings(
        redis_timeout_s=1.0,
        embed_timeout_s=10.0,
        verifier="learned",
        error_bound=0.05,
        feedback=True,
        bound_prior_path=path,
    )
    cache = ResponseCache(client, settings, encoder=encoder)
    await cache.start()
    try:
        assert await cache.store(ask(KITCHEN), answer())
        hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
        assert hit is not None and hit.kind == "semantic" and hit.bound_score is not None
        # the score the bound judged is the verifier's probability, not the cosine
        learned = settings.learned_verifier()
        assert learned is not None and hit.similarity is not None
        assert hit.bound_score == pytest.approx(learned[0].probability(KITCHEN_PARAPHRASE, KITCHEN, hit.similarity))
        assert hit.bound_score != pytest.approx(hit.similarity)
        # a report makes the entry stricter on that same scale
        assert hit.feedback_id is not None and await cache.report_wrong(hit.feedback_id, "t1")
        stored = await cache._client.hget(hit.key, "bound")  # noqa: SLF001 - the entry's state in Redis
        assert EntryState.from_json(json.loads(stored)).wrong == 1
    finally:
        await cache.aclose()
        await client.aclose()


def test_the_prior_must_score_what_the_verifier_gives(tmp_path: Path) -> None:
    cosine, learned = tmp_path / "cosine.json", tmp_path / "learned.json"
    cosine.write_text(json.dumps(CLEAN.to_json()))
    learned.write_text(json.dumps(CLEAN_LEARNED.to_json()))
    with pytest.raises(ValidationError, match="needs a 'learned' prior"):
        CacheSettings(verifier="learned", error_bound=0.02, bound_prior_path=cosine)
    with pytest.raises(ValidationError, match="needs a 'cosine' prior"):
        CacheSettings(verifier="rules", error_bound=0.02, bound_prior_path=learned)
    # no path: each verifier gets its own shipped prior
    shipped = CacheSettings(verifier="learned", error_bound=0.02).bound_prior()
    assert shipped is not None and shipped.kind == "learned"
    rules = CacheSettings(verifier="rules", error_bound=0.02).bound_prior()
    assert rules is not None and rules.kind == "cosine"


# issue 34 item 2: the "region" mode on the learned verifier's probability, in the cache
REGION_LEARNED = BoundPrior(
    "learned", 0.5, (0.5, 0.8, 0.9), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), source="region", mode="region"
)


def with_system(text: str, system: str, tenant: str = "t1") -> CacheRequest:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}]}
    return CacheRequest("chat.completions", body, tenant, CacheControl())


async def test_the_region_bound_serves_once_its_pools_labels_vouch_and_never_across_scopes(
    redis_url: str, encoder: Encoder, tmp_path: Path
) -> None:
    path = tmp_path / "region.json"
    path.write_text(json.dumps(REGION_LEARNED.to_json()))
    client = aioredis.Redis.from_url(redis_url)
    settings = CacheSettings(
        redis_timeout_s=1.0, embed_timeout_s=10.0, verifier="learned", error_bound=0.05, bound_prior_path=path
    )
    cache = ResponseCache(client, settings, encoder=encoder)
    await cache.start()
    try:
        assert cache.semantic is not None and cache.semantic.bound is not None
        bound = cache.semantic.bound
        assert bound.prior.mode == "region"
        assert await cache.store(ask(KITCHEN), answer())
        assert await cache.store(with_system(KITCHEN, "You answer about boats."), answer("Boats have no kitchen."))
        # no labels yet: the paraphrase is explored, not served
        assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
        # the pool's labels vouch for every bin (100 right, none wrong, 88 are needed at 5 %)
        for tenant in ("t1", "t2"):
            await client.hset(bound.pool_key(pool_name(tenant, "m")), mapping={"r0": 100, "r1": 100, "r2": 100})
        hit = await cache.lookup(ask(KITCHEN_PARAPHRASE))
        assert hit is not None and hit.kind == "semantic" and hit.bound_score is not None
        assert hit.response["choices"][0]["message"]["content"] == "Flip the switch by the door."
        # never across scopes: another tenant, or the same tenant in another context, gets no
        # other scope's entry, though its pool vouches as much
        assert await cache.lookup(ask(KITCHEN_PARAPHRASE, tenant="t2")) is None
        other = await cache.lookup(with_system(KITCHEN_PARAPHRASE, "You answer about boats."))
        assert other is None or other.response["choices"][0]["message"]["content"] == "Boats have no kitchen."
        assert await cache.lookup(with_system(KITCHEN_PARAPHRASE, "You are a chef.")) is None
        # the pool's labels turn: many wrong ones where it served, and it refuses again
        await client.hset(bound.pool_key(pool_name("t1", "m")), mapping={"w0": 50, "w1": 50, "w2": 50})
        assert await cache.lookup(ask(KITCHEN_PARAPHRASE)) is None
        # a steps prior's pool (same tenant and model) is another key: counts of one bin
        # layout are never read as another's
        steps = BoundStore(client, bound.prefix, CLEAN_LEARNED)
        assert steps.pool_key(pool_name("t1", "m")) != bound.pool_key(pool_name("t1", "m"))
    finally:
        await cache.aclose()
        await client.aclose()
