"""Unit tests of the pure dispatch scoring and policies (no I/O)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from router.dispatch import Context, ReplicaView, Weights, estimated_requests, hot, pick, ring_walk, score
from router.dispatch.signals import Signals

W = Weights()


def view(key: str, inflight: int = 0, age: float | None = 0.1, **signals: float) -> ReplicaView:
    sig = Signals(**signals) if age is not None else None
    return ReplicaView(key, inflight=inflight, signals=sig, inflight_at_scrape=0, age_s=age)


def test_requests_sent_since_the_scrape_are_added_not_double_counted() -> None:
    # Scrape saw 3 open requests, 2 of them ours; since then we sent 2 more.
    v = ReplicaView("a", inflight=4, signals=Signals(waiting=0, running=3), inflight_at_scrape=2, age_s=0.1)
    assert estimated_requests(v, W) == 5
    # Ours finished since the scrape: the scrape's count shrinks by them, never below our own.
    done = ReplicaView("a", inflight=0, signals=Signals(waiting=0, running=3), inflight_at_scrape=3, age_s=0.1)
    assert estimated_requests(done, W) == 0


def test_stale_snapshot_is_distrusted_and_inflight_used() -> None:
    looks_idle = ReplicaView(
        "a",
        inflight=7,
        signals=Signals(waiting=0, running=0, kv_usage=0.0),
        inflight_at_scrape=0,
        age_s=W.stale_after_s + 5,
    )
    assert score(looks_idle, W) == 7
    busy = view("b", inflight=2, running=2, kv_usage=0.1)
    assert pick([looks_idle, busy], "gpu_load", Context()).key == "b"


def test_queue_and_kv_usage_raise_the_score() -> None:
    base = score(view("a", running=4, kv_usage=0.2), W)
    assert score(view("a", running=4, waiting=2, kv_usage=0.2), W) > base + 2
    assert score(view("a", running=4, kv_usage=0.7), W) > base


def test_memory_penalty_is_squared_and_temperature_counts_above_75c() -> None:
    low, high = score(view("a", mem_used=0.3), W), score(view("a", mem_used=0.6), W)
    assert high == pytest.approx(low * 4)
    assert score(view("a", temp_c=75.0), W) == score(view("a"), W)
    assert score(view("a", temp_c=85.0), W) == pytest.approx(score(view("a"), W) + 10 * W.temp_per_c)


def test_gpu_load_picks_the_least_loaded() -> None:
    views = [view("a", running=10), view("b", running=2, waiting=0, kv_usage=0.3), view("c", running=6)]
    assert pick(views, "gpu_load", Context()).key == "b"


@pytest.mark.parametrize("signals", [{"kv_usage": 0.9}, {"mem_used": 0.9}, {"gpu_util": 0.95}])
def test_hot_replica_is_avoided_while_another_is_not(signals: dict[str, float]) -> None:
    hot_one = view("a", **signals)
    assert hot(hot_one, W)
    busy_but_cool = view("b", running=30, kv_usage=0.5)
    assert pick([hot_one, busy_but_cool], "gpu_load", Context()).key == "b"
    # When all are hot, the best of them is still used.
    assert pick([hot_one, view("c", running=30, kv_usage=0.95)], "gpu_load", Context()).key == "a"


def test_ties_rotate_so_an_idle_pool_fills_evenly() -> None:
    views = [view(k) for k in "abc"]
    chosen = [pick(views, "gpu_load", Context(ticket=t)).key for t in range(6)]
    assert Counter(chosen) == {"a": 2, "b": 2, "c": 2}


def test_round_robin_and_least_request() -> None:
    views = [view("a", inflight=3), view("b", inflight=1), view("c", inflight=2)]
    assert [pick(views, "round_robin", Context(ticket=t)).key for t in range(3)] == ["a", "b", "c"]
    assert pick(views, "least_request", Context()).key == "b"


def test_power_of_two_never_picks_the_worst_of_its_two_samples() -> None:
    views = [view("a", running=1), view("b", running=5), view("c", running=9)]
    rng = random.Random(7)
    picks = Counter(pick(views, "power_of_two", Context(rng=rng)).key for _ in range(300))
    assert "c" not in picks and picks["a"] > picks["b"]


def test_session_affinity_is_sticky_and_bounded_by_load() -> None:
    views = [view(k) for k in "abcd"]
    first = pick(views, "gpu_load", Context(session="user-42")).key
    assert all(pick(views, "gpu_load", Context(ticket=t, session="user-42")).key == first for t in range(10))
    # The sticky replica is overloaded: the session moves to the next replica on its ring.
    loaded = [view(v.key, inflight=20 if v.key == first else 0, running=20 if v.key == first else 0) for v in views]
    moved = pick(loaded, "gpu_load", Context(session="user-42")).key
    assert moved != first
    assert moved == ring_walk(tuple("abcd"), "user-42")[1]


def test_consistent_hashing_moves_few_sessions_when_a_replica_is_added() -> None:
    sessions = [f"s{i}" for i in range(400)]
    before = {s: ring_walk(tuple("abcd"), s)[0] for s in sessions}
    after = {s: ring_walk(tuple("abcde"), s)[0] for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert all(after[s] == "e" for s in moved)
    assert len(moved) < 0.35 * len(sessions)


def test_prefix_affinity_prefers_the_recent_replica_within_bounds() -> None:
    views = [view("a", running=2), view("b", running=1), view("c", running=1)]
    assert pick(views, "gpu_load", Context(preferred="a")).key == "a"
    views[0] = view("a", running=9)
    assert pick(views, "gpu_load", Context(preferred="a")).key != "a"


def test_empty_and_unknown_policy_raise() -> None:
    with pytest.raises(ValueError):
        pick([], "gpu_load", Context())
    with pytest.raises(ValueError):
        pick([view("a")], "fastest", Context())
