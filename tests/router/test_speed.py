"""Replica speed learned from the router's own observations: the pure estimate, its effect on
dispatch, and the live router learning it from sim replicas of different speed."""

from __future__ import annotations

from collections import Counter

import pytest

from router.dispatch import Context, ReplicaView, Weights, pick, speed_adjusted
from router.dispatch.signals import Signals
from router.dispatch.speed import PROMPT_WEIGHT, Speed, SpeedConfig, current, observe, sample, slowness
from sim import Profile
from tests.bench_script import load_bench
from tests.router.conftest import CHAT, FAST

C = SpeedConfig()


def learned(s_per_token: float, samples: int = 10, at: float = 100.0) -> Speed:
    speed = None
    for i in range(samples):
        speed = observe(speed, s_per_token, at - samples + 1 + i)
    assert speed is not None
    return speed


def test_sample_is_seconds_per_token_of_work_and_skips_unknowns() -> None:
    assert sample(2.0, 100) == pytest.approx(0.02)
    assert sample(2.0, 100, prompt_tokens=1000) == pytest.approx(2.0 / (100 + PROMPT_WEIGHT * 1000))
    assert sample(2.0, 0, prompt_tokens=1000) is None  # no usage: nothing learned
    assert sample(0.0, 10) is None and sample(float("nan"), 10) is None


def test_the_estimate_averages_first_then_follows_with_the_ewma() -> None:
    speed = observe(None, 0.03, 0.0)
    assert (speed.s_per_token, speed.samples) == (0.03, 1)
    speed = observe(speed, 0.01, 0.0)
    assert speed.s_per_token == pytest.approx(0.02)  # a mean while there are few samples
    steady = learned(0.01, samples=50)
    moved = observe(steady, 0.05, steady.at)
    assert moved.s_per_token == pytest.approx(0.01 + 0.2 * 0.04, rel=0.01)  # one EWMA step (alpha 0.2)


def test_a_sample_after_a_long_silence_counts_for_more() -> None:
    old = learned(0.01, samples=50, at=0.0)
    soon, late = observe(old, 0.05, 1.0), observe(old, 0.05, 300.0)
    assert late.s_per_token > soon.s_per_token
    assert late.s_per_token == pytest.approx(0.05, rel=0.01)


def test_slowness_is_relative_to_the_fastest_known_replica_less_the_dead_band() -> None:
    fast, slow = learned(0.01), learned(0.03)
    assert slowness([fast, slow], 100.0) == pytest.approx([1.0, 3.0 - C.dead_band], rel=0.05)
    # replicas of one GPU type whose estimates differ by noise stay equal, so ties keep rotating
    assert slowness([fast, learned(0.012)], 100.0) == [1.0, 1.0]


def test_unknown_replicas_count_as_fastest_so_they_are_measured_not_starved() -> None:
    assert slowness([learned(0.01), None, learned(0.05)], 100.0)[1] == 1.0
    assert slowness([learned(0.05), None], 100.0) is None  # fewer than two known: no opinion


def test_few_samples_earn_little_trust_and_a_stale_estimate_decays_to_neutral() -> None:
    fast = learned(0.01)
    one = observe(None, 0.05, 100.0)
    assert slowness([fast, one], 100.0)[1] == pytest.approx(1 + (5 - C.dead_band - 1) / C.min_samples, rel=0.05)
    slow = learned(0.05)
    now = [100.0, 100.0 + C.half_life_s, 100.0 + 10 * C.half_life_s]
    factors = [slowness([fast, slow], t)[1] for t in now]
    assert factors[0] > factors[1] > factors[2] and factors[2] < 1.01


def test_an_outlier_cannot_exclude_a_replica_for_good() -> None:
    assert slowness([learned(0.01), learned(10.0)], 100.0)[1] == C.max_factor


def test_speed_adjusted_scores_rank_the_idle_slow_replica_with_a_busier_fast_one() -> None:
    assert speed_adjusted(0.0, 1.0) == 0.0 and speed_adjusted(3.0, 1.0) == 3.0  # unchanged at factor 1
    assert speed_adjusted(0.0, 3.0) == speed_adjusted(2.0, 1.0)


def view(key: str, running: float, speed: Speed | None) -> ReplicaView:
    return ReplicaView(key, inflight=0, signals=Signals(waiting=0, running=running), age_s=0.1, speed=speed)


def test_gpu_load_sends_fewer_requests_to_the_slow_replica_until_its_load_balances() -> None:
    fast, slow = learned(0.01), learned(0.03)
    assert pick([view("a100", 1, fast), view("t4", 0, slow)], "gpu_load", Context(now=100.0)).key == "a100"
    assert pick([view("a100", 3, fast), view("t4", 0, slow)], "gpu_load", Context(now=100.0)).key == "t4"
    # without speed knowledge the idle replica always wins; with speed off the same
    assert pick([view("a100", 1, None), view("t4", 0, None)], "gpu_load", Context(now=100.0)).key == "t4"
    off = Weights(speed=None)
    assert pick([view("a100", 1, fast), view("t4", 0, slow)], "gpu_load", Context(now=100.0), off).key == "t4"


def test_an_unmeasured_new_replica_takes_its_share_of_an_idle_pool() -> None:
    views = [view("a", 0, learned(0.01)), view("b", 0, learned(0.01)), view("new", 0, None)]
    chosen = Counter(pick(views, "gpu_load", Context(ticket=t, now=100.0)).key for t in range(9))
    assert chosen == {"a": 3, "b": 3, "new": 3}


# --- live: the router learns from its own answers -----------------------------------------------

SLOW = Profile(
    name="slow",
    max_num_seqs=2,
    max_num_batched_tokens=256,
    kv_capacity_tokens=4000,
    max_model_len=1000,
    prefill_s_per_token=0.0,
    decode_base_s=0.05,
    decode_per_seq_s=0.0,
    kv_read_s_per_token=0.0,
)  # 10x the FAST profile's decode step


async def test_the_router_learns_which_replica_is_slow_and_prefers_the_fast_one(
    start_replica, start_router, client
) -> None:
    fast, slow = await start_replica(FAST), await start_replica(SLOW)
    router = await start_router([fast.url, slow.url])
    url = router.url + "/v1/chat/completions"
    served = Counter()
    for i in range(10):
        body = {**CHAT, "temperature": 0.05 * i}  # distinct: no cache hits
        if i % 2:
            body["stream"], body["stream_options"] = True, {"include_usage": True}
        response = await client.post(url, json=body)
        assert response.status_code == 200
        served[response.headers["x-promptedge-replica"]] += 1
    state = router.app.state.router
    speeds = {r.url: r.speed for r in state.pools.all()}
    assert speeds[fast.url] is not None and speeds[slow.url] is not None
    assert speeds[slow.url].s_per_token > speeds[fast.url].s_per_token
    assert served[slow.url] <= 2  # measured once or twice, then the fast replica takes the sequential load
    metrics = (await client.get(router.url + "/metrics")).text
    assert "promptedge_router_replica_seconds_per_token{" in metrics


def test_the_dispatch_bench_learns_speed_through_the_routers_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/dispatch_quality.py feeds finished requests to router.dispatch.speed in virtual time: with
    learning on, the T4s get a smaller share of the same steady traffic than with it off."""
    bench = load_bench("dispatch_quality")
    requests = [(i * 0.25, 300, 150) for i in range(400)]
    t4_share = {}
    for name, config in (("on", SpeedConfig()), ("off", None)):
        monkeypatch.setattr(bench, "Weights", lambda config=config, **kw: Weights(speed=config, **kw))
        share = bench.run(requests, "gpu_load")["share"]
        t4_share[name] = sum(v for key, v in share.items() if key.endswith("t4"))
    assert t4_share["on"] < t4_share["off"]


def test_a_stale_estimate_of_an_idle_replica_is_retested_and_replaced_by_a_probe() -> None:
    # issue 13, finding 8: a replica whose estimate kept a stall got 0 of ~150 requests in 15 s
    stalled = learned(1.0, at=100.0)  # 100x the others: the stall is in the samples
    assert current(stalled, 0, 100.0 + C.retest_s - 0.1) is stalled
    assert current(stalled, 0, 100.0 + C.retest_s) is None  # idle and stale: measured again
    assert current(stalled, 1, 100.0 + C.retest_s) is stalled  # a request is already measuring it
    fresh = observe(stalled, 0.01, 100.0 + C.retest_s, retest=True)  # the re-test's sample replaces it
    assert fresh.s_per_token == 0.01 and fresh.samples == stalled.samples + 1
    assert observe(stalled, 0.01, 100.0 + C.retest_s).s_per_token > 0.5  # any other sample moves it by alpha
    assert slowness([learned(0.01, at=106.0), fresh], 106.0) == [1.0, 1.0]


def test_a_noisy_retest_does_not_lock_a_recovered_replica_out_again() -> None:
    # CI, stop 24: the re-test's one sample was itself slow (a pause on a loaded machine), it
    # replaced the estimate with full trust, and the recovered replica got nothing for another
    # retest_s (36 of 250 requests in seconds 8-12 after its recovery instead of about a third)
    stalled = learned(1.0, at=100.0)
    speed = observe(stalled, 0.1, 106.0, retest=True)  # 10x the others, once
    for i in range(C.min_samples - 1):
        assert current(speed, 0, 106.0 + i / 10) is None  # idle while probing: measured again at once
        speed = observe(speed, 0.01, 106.05 + i / 10)
    assert speed.probe == () and speed.s_per_token == 0.01  # the probe's median: the outlier is out
    assert slowness([learned(0.01, at=106.5), speed], 106.5) == [1.0, 1.0]
    assert current(speed, 0, 106.5) is speed  # probe over: trusted again


def test_a_genuinely_slow_replica_keeps_its_factor_through_a_retest() -> None:
    fast, t4 = learned(0.01, at=100.0), learned(0.03, at=100.0)
    later = 100.0 + 2 * C.retest_s
    assert current(t4, 0, later) is None  # idle for a while: a probe re-tests it ...
    for i in range(C.min_samples):  # ... and measures it slow again (one sample slower still)
        t4 = observe(t4, 0.03 * (1.5 if i == 2 else 1.0), later + i / 10, retest=i == 0)
    fast = observe(fast, 0.01, later)
    assert t4.probe == ()
    assert slowness([fast, t4], later + 0.5) == pytest.approx([1.0, 3.0 - C.dead_band], rel=0.05)
