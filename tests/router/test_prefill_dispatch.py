"""Pending prefill: a replica still working on prompts it has not begun to answer makes a new
request wait for them, whatever its count of open requests says (closed loop, 3 December: 33 of
49 TTFT misses had another prompt's prefill ahead on the same replica, 20 of them while another
replica had none pending)."""

from __future__ import annotations

import asyncio

import pytest

from router.dispatch import Context, ReplicaView, Weights, pick, score
from router.dispatch.signals import Signals
from router.fleet.health import HealthConfig
from router.fleet.replicas import Replica
from router.settings import ReplicaSpec
from sim import Profile
from tests.router.conftest import MODEL

# Prefill 0.1 ms per token in chunks of 2,048 tokens (a 6,000-token prompt: ~0.6 s), 10 ms per
# decode step: a 500-token answer takes ~5 s after its prefill.
SLOW = Profile(
    name="slow",
    max_num_seqs=16,
    max_num_batched_tokens=2048,
    kv_capacity_tokens=64_000,
    max_model_len=16_000,
    prefill_s_per_token=0.0001,
    decode_base_s=0.01,
    decode_per_seq_s=0.0,
    kv_read_s_per_token=0.0,
)


def test_a_replica_prefilling_a_long_prompt_loses_to_one_busier_only_with_decodes() -> None:
    # a: one open request, its 4,000-token prompt not yet answered; b: three open, all decoding
    a = ReplicaView("a", inflight=1, prefill_tokens=4000)
    b = ReplicaView("b", inflight=3)
    assert pick([a, b], "gpu_load", Context()).key == "b"
    assert pick([a, b], "least_request", Context()).key == "a"  # counts requests only, as documented


def test_the_pending_prefill_counts_in_the_scores_unit_fresh_or_stale() -> None:
    w = Weights()
    stale = ReplicaView("a", inflight=1, prefill_tokens=2000)
    assert score(stale, w) == 1 + 2 * w.prefill_per_1k
    fresh = ReplicaView(
        "a", inflight=1, prefill_tokens=1000, signals=Signals(running=1.0, waiting=0.0), inflight_at_scrape=1, age_s=0.1
    )
    assert (
        score(fresh, w)
        == score(
            ReplicaView("a", inflight=1, signals=Signals(running=1.0, waiting=0.0), inflight_at_scrape=1, age_s=0.1), w
        )
        + w.prefill_per_1k
    )
    assert score(stale, Weights(prefill_per_1k=0.0)) == 1


def test_a_lease_holds_its_prompt_as_pending_until_the_first_byte_or_the_end() -> None:
    replica = Replica(ReplicaSpec(url="http://r:8000", model="m"), HealthConfig())
    first = replica.lease(prefill_tokens=3000)
    second = replica.lease(prefill_tokens=500)
    assert replica.view(0.0).prefill_tokens == 3500
    first.first_byte()
    first.first_byte()  # once only
    assert replica.view(0.0).prefill_tokens == 500 and replica.inflight == 2
    first.release()
    assert replica.view(0.0).prefill_tokens == 500 and replica.inflight == 1
    second.release()  # ended (an error, a non-stream answer) before any first byte was seen
    second.release()
    assert replica.view(0.0).prefill_tokens == 0 and replica.inflight == 0


def test_a_non_stream_prompt_is_pending_until_a_scrape_begun_after_it_shows_nothing_waiting() -> None:
    replica = Replica(ReplicaSpec(url="http://r:8000", model="m"), HealthConfig())
    early = replica.lease(prefill_tokens=3000, streamed=False)
    sent = replica.unadmitted[early]
    late = replica.lease(prefill_tokens=500, streamed=False)
    replica.unadmitted[late] = sent + 1.0  # sent a second later
    stream = replica.lease(prefill_tokens=200)  # ends at its first byte, as before
    replica.observe(Signals(waiting=1.0, running=1.0), sent + 2, sent_before=sent + 0.5)
    assert replica.prefill_tokens == 3700  # something waits: any of them may be it
    replica.observe(Signals(running=2.0), sent + 2, sent_before=sent + 0.5)
    assert replica.prefill_tokens == 3700  # no queue exported: no evidence
    replica.observe(Signals(waiting=0.0, running=2.0), sent + 2, sent_before=sent + 0.5)
    assert replica.prefill_tokens == 700  # only the one that had time to get there is taken in
    assert list(replica.unadmitted) == [late]
    late.release()  # ends first: gone from the queue, nothing counted twice
    assert not replica.unadmitted and replica.prefill_tokens == 200
    replica.observe(Signals(waiting=0.0, running=1.0), sent + 3, sent_before=sent + 2.5)
    early.release()
    stream.release()
    assert replica.prefill_tokens == 0 and replica.inflight == 0 and not replica.unadmitted


@pytest.mark.usefixtures("exact_only")  # dispatch only: no embedding model to load
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/responses"])
async def test_a_non_stream_prompt_stops_counting_as_pending_once_the_replica_admitted_it(
    endpoint, start_replica, start_router, client
) -> None:
    """A non-stream answer's first byte comes after the whole generation; its prompt counted as
    pending prefill until then, so one long non-stream request made its replica look busy for
    its whole answer (~19 s for a 20k-word prompt whose prefill took 2.7 s) and every other
    request avoided it (attack round, finding 1: 40 of 40 went to the other replica)."""
    replicas = [await start_replica(SLOW) for _ in range(2)]
    router = await start_router([r.url for r in replicas])  # gpu_load, scrapes every 0.25 s
    state = router.app.state.router
    text = "Summarise the following report in detail. " * 560  # ~24,000 characters: ~6,000 tokens
    body = (
        {"model": MODEL, "input": text, "max_output_tokens": 500}
        if endpoint == "/v1/responses"
        else {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 500}
    )
    long = asyncio.create_task(client.post(router.url + endpoint, json=body, timeout=30))
    for _ in range(300):
        busy = [r for r in state.pools.all() if r.inflight]
        if busy:
            break
        await asyncio.sleep(0.01)
    (a,) = busy
    assert a.prefill_tokens > 5000  # pending while the replica has not taken it in
    await asyncio.sleep(1.5)  # its prefill (~0.6 s) is over and scraped; its answer runs ~5 s more
    assert not long.done() and a.inflight == 1
    assert a.prefill_tokens == 0

    def short(i: int) -> dict:
        return {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": f"question {i}"}]}

    answers = await asyncio.gather(*(client.post(router.url + "/v1/chat/completions", json=short(i)) for i in range(6)))
    assert [r.status_code for r in answers] == [200] * 6
    served = [r.headers["x-promptedge-replica"] for r in answers]
    # A decodes one answer: as busy as one open request, not as 18 (6,000 pending tokens x 3 / 1,000)
    assert served.count(a.url) >= 1, served
    assert (await long).status_code == 200
    assert all(r.prefill_tokens == 0 and r.inflight == 0 for r in state.pools.all())
