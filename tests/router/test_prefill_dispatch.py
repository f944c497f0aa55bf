"""Pending prefill: a replica still working on prompts it has not begun to answer makes a new
request wait for them, whatever its count of open requests says (closed loop, 3 December: 33 of
49 TTFT misses had another prompt's prefill ahead on the same replica, 20 of them while another
replica had none pending)."""

from __future__ import annotations

from router.dispatch import Context, ReplicaView, Weights, pick, score
from router.health import HealthConfig
from router.replicas import Replica
from router.settings import ReplicaSpec
from router.dispatch.signals import Signals


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
    fresh = ReplicaView("a", inflight=1, prefill_tokens=1000, signals=Signals(running=1.0, waiting=0.0),
                        inflight_at_scrape=1, age_s=0.1)
    assert score(fresh, w) == score(ReplicaView("a", inflight=1, signals=Signals(running=1.0, waiting=0.0),
                                                inflight_at_scrape=1, age_s=0.1), w) + w.prefill_per_1k
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
