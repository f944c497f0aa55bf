"""Issue 31 item 2: the minute in progress and a router's first partial minute never count as
demand. The router's own counter writer (router/observe/counters.py, on a clock the test moves)
writes into a real Redis; the forecaster's Redis source and runner read it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import redis.asyncio as aioredis

from forecaster import ForecasterSettings, RedisCounterSource, RedisStateStore, run_once
from forecaster.sources.pops import sum_counts
from router.observe.counters import TrafficCounters

MINUTE = 29_100_000  # a Unix minute
FLUSH_S = 15  # the router flushes every 15 s in these tests (its default is 1 s: 15 is a lag) ...
PHASE_S = 7  # ... at 7 s past the minute, then 22, 37 and 52 s (its task is not aligned to minutes)


class StepClock:
    """The router's clock, moved by the test (Unix s)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


async def serve(counters: TrafficCounters, clock: StepClock, until: float, per_s: int, flush: bool = True) -> None:
    """The router up from ``clock.t`` to ``until`` (Unix s): ``per_s`` requests every second,
    a flush every ``FLUSH_S`` s of its clock (as its background task does), ``PHASE_S`` past the
    minute."""
    while clock.t < until:
        for _ in range(per_s):
            counters.count("m", miss=True, prompt_tokens=0, completion_tokens=0)
        clock.t += 1
        if flush and (clock.t - PHASE_S) % FLUSH_S == 0:
            assert await counters.flush()


def router(client: aioredis.Redis, at: float) -> tuple[TrafficCounters, StepClock]:
    """A router process started at ``at`` (Unix s)."""
    clock = StepClock(at)
    return TrafficCounters(client, clock, flush_s=FLUSH_S, models=["m"]), clock  # type: ignore[arg-type]


def by_minute(source: RedisCounterSource, now: float) -> dict[int, float]:
    traffic = source.fetch(now)
    return dict(zip((traffic.times() // 60).astype(int).tolist(), traffic.requests.tolist()))


async def test_a_router_restarted_mid_minute_is_not_read_as_a_drop(redis_url: str) -> None:
    """Router A counts 2 req/s and dies 20 s into minute X (SIGKILL: nothing more is flushed);
    its replacement starts 45 s into X. Minute X holds A's first 15 s and B's last 15 s: read as
    demand it is a drop to half. It is missing instead; the minutes around it are as counted."""
    client = aioredis.Redis.from_url(redis_url)
    a, a_clock = router(client, MINUTE * 60.0)
    x = MINUTE + 10
    await serve(a, a_clock, x * 60 + 20, per_s=2)  # flushed at +7, then killed
    b, b_clock = router(client, x * 60 + 45.0)
    await serve(b, b_clock, (x + 2) * 60 + 8, per_s=2)
    seen = by_minute(RedisCounterSource(redis_url, "m", 3600.0), (x + 2) * 60 + 10)
    assert seen[x - 1] == pytest.approx(2.0) and seen[x + 1] == pytest.approx(2.0)
    assert math.isnan(seen[x]), f"the restart minute read as {seen[x]:.2f} req/s (demand is 2)"
    await client.aclose()


@pytest.mark.parametrize("skew_s", [0.0, 20.0], ids=["flush-lag", "router-clock-behind"])
async def test_the_minute_in_progress_never_counts(redis_url: str, skew_s: float) -> None:
    """A forecaster reading 2 s after a minute boundary, before the router's first flush after
    it (flush lag), or with the router's clock 20 s behind (skew): the minute the router is still
    counting is not read (its flushed part is a fraction of its demand), and the series ends at
    the last minute the router finished, not with a missing minute (which would hold)."""
    client = aioredis.Redis.from_url(redis_url)
    r, clock = router(client, MINUTE * 60.0)
    m = MINUTE + 10
    await serve(r, clock, (m + 1) * 60 + 2 - skew_s, per_s=2)
    traffic = RedisCounterSource(redis_url, "m", 3600.0).fetch((m + 1) * 60 + 2)
    assert traffic.end == m * 60, (
        f"series ends at minute {traffic.end / 60 - MINUTE:.0f}, its last rate "
        f"{traffic.requests[-1]:.2f} req/s (demand is 2)"
    )
    np.testing.assert_allclose(traffic.requests[-10:], 2.0)
    await client.aclose()


async def test_a_decision_over_four_replicas_right_after_a_router_restart_keeps_four(redis_url: str) -> None:
    """A forecaster that has been deciding for a quarter of an hour over a pool of 4 (4 req/s,
    1 req/s a replica); the router is killed and restarted within one minute. The decision
    right after it, and the one after that, keep 4. The stabilisation window is one minute and
    the model the last value, so that nothing but the data decides."""
    client = aioredis.Redis.from_url(redis_url)
    settings = ForecasterSettings(
        redis_url=redis_url,
        model_name="m",
        capacity_per_replica=1.0,
        headroom=0.0,
        upper_headroom=0.0,
        history_s=3600.0,
        rate_window_s=60.0,
        models=["last_value"],
        down_cooldown_s=60.0,
        warmup_s=0.0,
        actuation_delay_s=0.0,
        max_replicas=10,
    )
    source = RedisCounterSource(redis_url, "m", settings.history_s)
    store = RedisStateStore(redis_url, "promptedge:forecaster:state:partial")
    a, a_clock = router(client, MINUTE * 60.0)
    current = 4
    x = MINUTE + 15
    for minute in range(MINUTE + 1, x + 1):
        await serve(a, a_clock, minute * 60 + 10, per_s=4)
        d = run_once(settings, source, now=minute * 60 + 10, store=store, current=current).decision
        assert d.replicas == 4, d.reason
    await serve(a, a_clock, x * 60 + 20, per_s=4)  # killed 20 s into minute x
    b, b_clock = router(client, x * 60 + 45.0)
    for minute in (x + 1, x + 2):
        await serve(b, b_clock, minute * 60 + 10, per_s=4)
        d = run_once(settings, source, now=minute * 60 + 10, store=store, current=current).decision
        assert d.replicas == 4, d.reason
    await client.aclose()


async def test_pops_stay_on_one_grid_when_one_pop_is_still_counting(redis_url: str) -> None:
    """Two POPs (their counts read apart, summed as PopsCounterSource does): one POP's router has
    finished the last minute, the other's is still counting it (flush lag). The sum is on one
    grid and ends at the minute both finished; no POP's open minute is summed as known."""
    client = aioredis.Redis.from_url(redis_url)
    r, clock = router(client, MINUTE * 60.0)
    m = MINUTE + 10
    await serve(r, clock, (m + 1) * 60 - 20, per_s=2)
    lagging = RedisCounterSource(redis_url, "m", 600.0).read_counts((m + 1) * 60 + 2)
    await serve(r, clock, (m + 1) * 60 + 15, per_s=2)
    finished = RedisCounterSource(redis_url, "m", 600.0).read_counts((m + 1) * 60 + 2)
    assert finished.to_traffic("one").end == (m + 1) * 60
    traffic = sum_counts([finished, lagging]).to_traffic("both")
    assert traffic.end == m * 60
    np.testing.assert_allclose(traffic.requests[-5:], 4.0)
    await client.aclose()
