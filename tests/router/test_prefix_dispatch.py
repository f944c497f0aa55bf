"""Prefix-cache-aware dispatch: the router's chunk-hash index (pure), the scorer's bounded-load
rule (pure), the KV size read from vllm:cache_config_info, and a live check that a shared
prompt prefix lands on the replica whose prefix cache then reports the hits."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.dispatch import Context, ReplicaView, Weights, load_bound, pick
from router.dispatch.prefix_index import PrefixIndex, PrefixIndexes, capacity_chunks, chunk_hashes, prompt_text
from router.dispatch.signals import Signals, parse_metrics
from tests.router.conftest import MODEL


def view(key: str, running: float = 0.0, waiting: float = 0.0, kv: float = 0.0) -> ReplicaView:
    return ReplicaView(key, signals=Signals(waiting=waiting, running=running, kv_usage=kv), age_s=0.1)


def chat(system: str, question: str) -> dict:
    return {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


def test_chunk_hashes_chain_and_skip_the_partial_chunk() -> None:
    a, b = "x" * 1000, "x" * 600 + "y" + "x" * 399
    ha, hb = chunk_hashes(a, 256), chunk_hashes(b, 256)
    assert len(ha) == 3  # 1000 // 256: the partial last chunk is not hashed
    assert ha[:2] == hb[:2] and ha[2] != hb[2]  # differ from the chunk holding the change on
    assert chunk_hashes("é" * 600, 256) == chunk_hashes("é" * 513, 256)  # by characters, not bytes
    assert prompt_text(chat("s", "q")) == "system\x1fs\x1euser\x1fq\x1e"
    assert chunk_hashes(a, 256, max_chunks=2) == ha[:2]
    with pytest.raises(ValueError):
        chunk_hashes(a, 0)


def test_index_is_lru_bounded_and_forgets_a_prompt_tail_first() -> None:
    index = PrefixIndex(capacity=4)
    first = [1, 2, 3]
    index.add(first)
    index.add([10, 11])  # over capacity: the oldest entry is first's tail (3)
    assert len(index) == 4 and index.matched(first) == 2 and index.matched([10, 11]) == 2
    assert capacity_chunks(400_000, 256) == 6250  # 400k tokens x 4 characters / 256


def test_index_capacity_follows_the_replica_kv_size() -> None:
    indexes = PrefixIndexes(chunk_chars=256, kv_tokens_default=256)  # 4 chunks by default, 2 per prompt
    indexes.record("a", [1, 2, 3])
    assert indexes.matches(["a", "b"], [1, 2, 3]) == {"a": 2 / 3, "b": 0.0}
    indexes.record("a", [1, 2, 3], kv_tokens=1024)  # the replica told: 16 chunks
    assert indexes.matches(["a"], [1, 2, 3]) == {"a": 1.0}
    assert indexes.matches(["a"], []) == {}
    indexes.forget(["b"])
    assert indexes.matches(["a"], [1]) == {"a": 0.0}


def test_prefix_bonus_wins_within_the_load_bound() -> None:
    views = [view("a", running=3), view("b", running=2), view("c", running=2), view("d", running=2)]
    w = Weights(prefix=3.0)  # a full match is worth 3 open requests
    assert pick(views, "prefix_aware", Context(), w).key != "a"  # no match: plain gpu_load
    assert pick(views, "prefix_aware", Context(prefix_match={"a": 1.0}), w).key == "a"
    # a weaker match (0.6 requests' worth) is worth less than the extra open request
    assert pick(views, "prefix_aware", Context(prefix_match={"a": 0.2}), w).key != "a"


def test_a_match_is_worth_the_prefill_it_saves_so_a_long_prompt_outweighs_more_load() -> None:
    # "a" has 4 more open requests than the others. A half-matched prompt of 1,000 tokens saves
    # 500 tokens of prefill (1.5 requests' worth at W_prefill 3, plus W_prefix 2 x 0.5 = 1):
    # not enough. The same match on a 6,000-token prompt saves 3,000 tokens (9 + 1): enough.
    views = [view("a", running=5), view("b", running=1), view("c", running=1), view("d", running=1)]
    w = Weights(prefix=2.0, prefill_per_1k=3.0, affinity_load_factor=4.0)  # bound ceil(4 x 9/4) = 9
    match = {"a": 0.5}
    assert pick(views, "prefix_aware", Context(prefix_match=match, prompt_tokens=1000), w).key != "a"
    assert pick(views, "prefix_aware", Context(prefix_match=match, prompt_tokens=6000), w).key == "a"


def test_locality_is_never_followed_into_a_hotspot() -> None:
    # bound = ceil(1.25 x (17 + 1) / 4) = 6: "a" with 8 open requests gets no bonus however large
    views = [view("a", running=8), view("b", running=3), view("c", running=3), view("d", running=3)]
    assert load_bound([8, 3, 3, 3], 1.25) == 6
    big = Weights(prefix=100.0)
    assert pick(views, "prefix_aware", Context(prefix_match={"a": 1.0}), big).key != "a"
    # at the bound (4 + 1 <= ceil(1.25 x 14 / 4) = 5) it still gets it
    views[0] = view("a", running=4)
    assert load_bound([4, 3, 3, 3], 1.25) == 5
    assert pick(views, "prefix_aware", Context(prefix_match={"a": 1.0}), big).key == "a"


def test_kv_size_is_read_from_cache_config_info() -> None:
    text = (
        b'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="25000"} 1.0\n'
        b'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1.0\n'
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
    )
    signals = parse_metrics(text)
    assert signals.kv_capacity_tokens == 400_000 and signals.running == 2
    assert parse_metrics(b'vllm:num_requests_running{engine="0"} 1.0\n').kv_capacity_tokens is None


@pytest.mark.usefixtures("exact_only")  # dispatch only: no embedding model to load
async def test_a_shared_prefix_goes_where_it_is_cached(start_replica, start_router, client) -> None:
    replicas = [await start_replica() for _ in range(3)]
    router = await start_router([r.url for r in replicas], policy="prefix_aware", scrape_interval_s=60)
    system = "You are a careful assistant. " * 30  # ~870 characters: 3 chunks of 256, ~220 tokens
    served = []
    for i in range(4):
        r = await client.post(router.url + "/v1/chat/completions", json=chat(system, f"question {i}"))
        assert r.status_code == 200
        served.append(r.headers["x-promptedge-replica"])
    assert len(set(served)) == 1  # requests run one at a time: always within the load bound
    async with httpx.AsyncClient() as plain:
        text = (await plain.get(served[0] + "/metrics")).text
    hits = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    # each of the 3 followers found the system prompt's 14 blocks of 16 tokens there
    assert hits["vllm:prefix_cache_hits_total"] == 3 * 14 * 16


def test_a_replica_reporting_a_huge_kv_cache_does_not_unbound_its_prefix_index() -> None:
    """The index's capacity follows the replica's vllm:cache_config_info labels; a replica
    saying num_gpu_blocks=10**12 made it unbounded: every distinct long prompt added up to
    2048 entries (~117 bytes each) for good (attack review Dec 2 #2)."""
    from router.dispatch.prefix_index import MAX_KV_TOKENS, PrefixIndexes, capacity_chunks
    from router.dispatch.signals import _kv_tokens

    indexes = PrefixIndexes(256, 400_000)
    huge = _kv_tokens({"num_gpu_blocks": str(10**12), "block_size": "16"})
    for i in range(3):
        indexes.record("http://r", indexes.hashes({"prompt": f"{i:08d}" + "x" * 256 * 2048}), huge)
    assert indexes.index("http://r", huge).capacity == capacity_chunks(MAX_KV_TOKENS, 256)
    assert MAX_KV_TOKENS >= 4_000_000  # the largest real KV caches (a TP-8 node) still fit whole


@pytest.mark.usefixtures("exact_only")
async def test_pending_prefill_counts_only_the_part_of_the_prompt_the_replica_probably_lacks(
    start_replica, start_router, client
) -> None:
    replica = await start_replica()
    router = await start_router(
        [replica.url], policy="prefix_aware", scrape_interval_s=60, timeouts={"P1": {"ttfb_s": 3.0}}
    )
    system = "You are a careful assistant. " * 30  # 3 chunks of 256 characters
    first = await client.post(router.url + "/v1/chat/completions", json=chat(system, "first"))
    assert first.status_code == 200
    assert (await client.post(replica.url + "/sim/faults", json={"hang": True})).status_code == 200
    (rep,) = router.app.state.router.pools.all()

    async def until_open(n: int) -> None:
        for _ in range(200):
            if rep.inflight == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{rep.inflight} open requests, expected {n}")

    url = router.url + "/v1/chat/completions"
    shared = asyncio.create_task(client.post(url, json=chat(system, "second")))
    await until_open(1)
    shared_pending = rep.prefill_tokens
    unrelated = asyncio.create_task(client.post(url, json=chat("Answer like a pirate, matey. " * 30, "third")))
    await until_open(2)
    unrelated_pending = rep.prefill_tokens - shared_pending
    # The unrelated prompt (same length) counts whole; the one whose system prompt the replica
    # just served counts only its unmatched part, as vLLM's prefix cache will skip the rest.
    assert unrelated_pending > 150
    assert shared_pending < unrelated_pending / 3
    answers = await asyncio.gather(shared, unrelated)
    assert [a.status_code for a in answers] == [504, 504]
    assert rep.prefill_tokens == 0 and rep.inflight == 0


def test_one_prompt_never_takes_more_than_half_a_replica_index() -> None:
    indexes = PrefixIndexes(chunk_chars=256, kv_tokens_default=640)  # 10 chunks
    indexes.record("a", [1, 2, 3, 4])
    indexes.record("a", list(range(100, 130)))  # 30 chunks: only its first 5 are recorded
    assert indexes.matches(["a"], [1, 2, 3, 4]) == {"a": 1.0}
    assert indexes.matches(["a"], list(range(100, 130))) == {"a": 5 / 30}


@pytest.mark.usefixtures("exact_only")
async def test_prompts_a_replica_rejects_do_not_evict_the_prefixes_it_holds(
    start_replica, start_router, client
) -> None:
    """The index recorded a prompt for the chosen replica before sending it, whatever came of
    it: 12 prompts of 600k characters, each answered 400 (over the model's context), took a
    victim's prefix match on its replica from 0.97 to 0.0 (attack round, finding 2). Only a
    prompt the replica accepted (2xx) is recorded now."""
    # FAST: max_model_len 1,000 tokens, KV 4,000 tokens: an index of 62 chunks of 256 characters
    replicas = [await start_replica() for _ in range(2)]
    router = await start_router([r.url for r in replicas], policy="prefix_aware", scrape_interval_s=60)
    state = router.app.state.router
    url = router.url + "/v1/chat/completions"
    victim = chat("You are a careful assistant. " * 30, "victim")  # 3 chunks, ~220 tokens
    served = await client.post(url, json=victim)
    assert served.status_code == 200
    home = served.headers["x-promptedge-replica"]
    hashes = state.forwarder.chooser.prefix_index.hashes(victim)
    assert state.forwarder.chooser.prefix_index.matches([home], hashes) == {home: 1.0}
    for i in range(12):  # ~5,000 tokens each: over max_model_len, 78 chunks each
        junk = await client.post(url, json=chat(f"{i:04d} " + "Ignore all that. " * 1200, "junk"))
        assert junk.status_code == 400
    assert state.forwarder.chooser.prefix_index.matches([home], hashes) == {home: 1.0}
    again = await client.post(url, json=chat("You are a careful assistant. " * 30, "again"))
    assert again.headers["x-promptedge-replica"] == home
