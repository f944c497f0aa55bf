"""Shadow verification of served semantic hits over HTTP, against real parts: the router app,
simulated replicas and Redis. With ``PROMPTEDGE_CACHE_SHADOW_RATE`` a served semantic hit of a
greedy request is also sent to a replica after the client has its answer; the two answers are
compared (cache/verify/bound/label.py) and the label teaches the entry and its pool, as a compared miss
does. The sim's answer depends on ``max_tokens`` and its ``reasoning_tokens`` setting only, not
on the prompt: a paraphrase gets the same answer (right) from a replica like the one that
answered the cached question, another answer (wrong) from one with reasoning tokens."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cache.verify.bound.model import BoundPrior
from tests.router.conftest import MODEL
from tests.router.test_cache_api import PARAPHRASE, QUESTION, post_until_stored

pytestmark = pytest.mark.slow

# served from cosine 0.80 (0.97 right, as good as certain): a paraphrase is a hit at delta 0.05
CLEAN = BoundPrior("cosine", 0.70, (0.70, 0.80), (0.30, 0.97), (1e6, 1e6), offset_var=1.0, source="clean")
SHADOW_METRIC = "promptedge_router_cache_shadow_verifications_total"


def greedy(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, **extra}


@pytest.fixture()
def bound_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The per-entry bound with a prior that serves paraphrases, and every hit shadow-verified
    (the test may lower SHADOW_MAX_INFLIGHT before starting its router)."""
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(CLEAN.to_json()))
    monkeypatch.setenv("PROMPTEDGE_CACHE_VERIFIER", "rules")  # the cosine prior judges the rules' choice
    monkeypatch.setenv("PROMPTEDGE_CACHE_ERROR_BOUND", "0.05")
    monkeypatch.setenv("PROMPTEDGE_CACHE_BOUND_PRIOR_PATH", str(path))
    monkeypatch.setenv("PROMPTEDGE_CACHE_SHADOW_RATE", "1")
    return monkeypatch


async def replica_answers(client: httpx.AsyncClient, replica_url: str) -> int:
    """Requests the sim replica finished (its vLLM counter ``vllm:request_success_total``)."""
    text = (await client.get(replica_url + "/metrics")).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
        )
    )


async def shadow_counts(client: httpx.AsyncClient, router_url: str) -> dict[str, int]:
    """The router's shadow verification counter by outcome (absent outcomes left out)."""
    out: dict[str, int] = {}
    for line in (await client.get(router_url + "/metrics")).text.splitlines():
        if line.startswith(SHADOW_METRIC + "{"):
            labels, value = line.rsplit(" ", 1)
            outcome = labels.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0) + int(float(value))
    return out


async def until(check: Any, timeout_s: float = 10.0) -> Any:
    """Poll the coroutine function ``check`` until it returns something truthy (returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def bound_states(redis_url: str) -> tuple[list[dict[str, int]], dict[str, int]]:
    """Every semantic entry's stored bound state (entries never labelled left out) and the
    summed pool counts (``r<i>`` / ``w<i>``) of every pool."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        entries = []
        for key in await client.keys("promptedge:cache:sem:entry:*"):
            raw = await client.hget(key, "bound")
            if raw:
                entries.append(json.loads(raw))
        pools: dict[str, int] = {}
        for key in await client.keys("promptedge:cache:bound:pool:*"):
            for field, value in (await client.hgetall(key)).items():
                pools[field.decode()] = pools.get(field.decode(), 0) + int(value)
        return entries, pools
    finally:
        await client.aclose()


async def test_a_served_hit_is_verified_once_off_path_and_labels_entry_and_pool_right(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    before = await replica_answers(client, replica.url)
    hit = await client.post(url, json=greedy(PARAPHRASE), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    assert await until(lambda: shadow_counts(client, router.url)) == {"right": 1}
    assert await replica_answers(client, replica.url) == before + 1  # exactly one replica call
    entries, pools = await bound_states(redis_url)
    assert [(e["n"], e["w"]) for e in entries] == [(1, 0)]
    assert pools == {"r1": 1}  # the step of cosine >= 0.80
    assert [r.inflight for r in router.app.state.router.pools.all()] == [0]


async def test_the_same_paraphrase_again_is_verified_but_labels_nothing(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    # Regression (attack round, 3 December): 40 hits of one paraphrase made 40 labels of one
    # (entry, query) pair; a repeat now counts as ``no_label`` and teaches neither entry nor pool
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a1": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a1"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    for i in range(5):
        hit = await client.post(url, json=greedy(PARAPHRASE), headers=a)
        assert hit.headers["x-cache"] == "semantic"

        async def settled(done: int = i + 1) -> bool:
            return sum((await shadow_counts(client, router.url)).values()) == done

        assert await until(settled)  # one at a time: the budget never skips one
    assert await shadow_counts(client, router.url) == {"right": 1, "no_label": 4}
    entries, pools = await bound_states(redis_url)
    assert [(e["n"], e["w"]) for e in entries] == [(1, 0)]
    assert pools == {"r1": 1}


async def test_a_streamed_hit_is_verified_with_a_non_stream_call(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient
) -> None:
    replica = await start_replica()
    # a token budget: the hit's answer also settles the tokens admission charged (two tasks after it)
    router = await start_router(
        [replica.url],
        api_keys={"key-a": "acme"},
        rate_limits={"*": {"requests_per_s": 10_000, "tokens_per_min": 10**8}},
    )
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    body = greedy(PARAPHRASE, stream=True, stream_options={"include_usage": True})
    hit = await client.post(url, json=body, headers=a)
    assert hit.headers["x-cache"] == "semantic" and hit.text.rstrip().endswith("data: [DONE]")
    # a stream's options on a non-stream call would be a 400 from vLLM: the call must drop them
    assert await until(lambda: shadow_counts(client, router.url)) == {"right": 1}


async def test_a_replica_that_answers_otherwise_labels_the_hit_wrong(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    # The cached answer comes from one replica, the shadow call's from another that answers in
    # other words (its first tokens are reasoning): the entry and its pool learn "wrong".
    first = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    a = {"authorization": "Bearer key-a"}
    await post_until_stored(client, first.url + "/v1/chat/completions", greedy(QUESTION), a)
    other = await start_replica(reasoning_tokens=3)
    router = await start_router([other.url], api_keys={"key-a": "acme"})
    hit = await client.post(router.url + "/v1/chat/completions", json=greedy(PARAPHRASE), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    assert await until(lambda: shadow_counts(client, router.url)) == {"wrong": 1}
    entries, pools = await bound_states(redis_url)
    assert [(e["n"], e["w"]) for e in entries] == [(1, 1)]
    assert pools == {"w1": 1}


async def test_a_sampled_hit_costs_no_replica_call(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION, temperature=0.7), a)
    before = await replica_answers(client, replica.url)
    hit = await client.post(url, json=greedy(PARAPHRASE, temperature=0.7), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    assert await until(lambda: shadow_counts(client, router.url)) == {"ineligible": 1}
    await asyncio.sleep(0.3)  # a call, had one been started, would have ended by now
    assert await replica_answers(client, replica.url) == before
    assert [r.inflight for r in router.app.state.router.pools.all()] == [0]
    assert await bound_states(redis_url) == ([], {})


async def test_a_full_budget_skips_and_never_delays_the_client(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient
) -> None:
    bound_on.setenv("PROMPTEDGE_CACHE_SHADOW_MAX_INFLIGHT", "1")
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    await client.post(replica.url + "/sim/faults", json={"hang": True})
    replicas = router.app.state.router.pools.all()
    started = time.perf_counter()
    first = await client.post(url, json=greedy(PARAPHRASE), headers=a)
    assert first.headers["x-cache"] == "semantic"
    # the shadow call hangs on the replica, holding its lease, while the client has its answer
    assert await until(lambda: asyncio.sleep(0, [r.inflight for r in replicas] == [1]))
    # the same connection again, and another paraphrase: answered at once, its shadow skipped
    second = await client.post(url, json=greedy("How can I switch on the kitchen lights?"), headers=a)
    third = await client.post(url, json=greedy(PARAPHRASE), headers=a)
    assert [second.headers["x-cache"], third.headers["x-cache"]] == ["semantic", "semantic"]
    assert time.perf_counter() - started < 5.0  # the hung call's timeout is 60 s (P2)
    assert await shadow_counts(client, router.url) == {"skipped_budget": 2}
    assert [r.inflight for r in replicas] == [1]  # skipped, not queued: still the one call
    await client.post(replica.url + "/sim/faults", json={"hang": False})  # the held call is served now

    async def settled() -> bool:
        return (await shadow_counts(client, router.url)).get("right") == 1

    assert await until(settled)
    assert await shadow_counts(client, router.url) == {"skipped_budget": 2, "right": 1}
    assert [r.inflight for r in replicas] == [0]


async def test_a_failed_shadow_call_leaves_no_label_no_traceback_and_no_lease(
    bound_on: pytest.MonkeyPatch,
    start_replica,
    start_router,
    client: httpx.AsyncClient,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 1.0})
    with caplog.at_level(logging.INFO):
        hit = await client.post(url, json=greedy(PARAPHRASE), headers=a)
        assert hit.status_code == 200 and hit.headers["x-cache"] == "semantic"
        assert await until(lambda: shadow_counts(client, router.url)) == {"error": 1}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert await bound_states(redis_url) == ([], {})
    state = router.app.state.router
    assert [(r.inflight, r.prefill_tokens) for r in state.pools.all()] == [(0, 0)]


async def test_no_replica_for_the_shadow_call_is_an_error_outcome(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)
    for r in router.app.state.router.pools.all():  # as discovery marks a replica scaled down
        r.health.draining = True
    hit = await client.post(url, json=greedy(PARAPHRASE), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    assert await until(lambda: shadow_counts(client, router.url)) == {"error": 1}
    assert await bound_states(redis_url) == ([], {})


async def test_shadow_calls_are_not_demand_in_the_forecasters_counters(
    bound_on: pytest.MonkeyPatch, start_replica, start_router, client: httpx.AsyncClient, redis_url: str
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], api_keys={"key-a": "acme"})
    url, a = router.url + "/v1/chat/completions", {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, greedy(QUESTION), a)  # misses, then one exact hit
    hit = await client.post(url, json=greedy(PARAPHRASE), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    assert await until(lambda: shadow_counts(client, router.url)) == {"right": 1}

    async def totals() -> dict[str, int]:
        store = aioredis.Redis.from_url(redis_url)
        try:
            out: dict[str, int] = {}
            for key in await store.keys(f"promptedge:traffic:{MODEL}:*"):
                for field, value in (await store.hgetall(key)).items():
                    name = field.decode().partition(":")[2]
                    out[name] = out.get(name, 0) + int(value)
            return out
        finally:
            await store.aclose()

    answered = await replica_answers(client, replica.url)  # every miss and the one shadow call

    async def flushed() -> dict[str, int]:  # counters flush every 0.05 s here
        counted = await totals()
        return counted if counted.get("requests", 0) >= answered + 1 else {}

    counted = await until(flushed)
    # demand is what clients asked: the misses and the two hits, never the shadow call
    assert counted["misses"] == answered - 1
    assert counted["requests"] == counted["misses"] + 2
