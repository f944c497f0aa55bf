"""Traffic counters on real Redis: counted minutes, quiet minutes marked 0, outages left empty."""

from __future__ import annotations

import redis.asyncio as aioredis

from router.observe.counters import TrafficCounters


class StepClock:
    """A clock the test moves by hand (Unix seconds)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


async def fields(client: aioredis.Redis, model: str, minute: int) -> dict[str, int]:
    raw = await client.hgetall(f"promptedge:traffic:{model}:{minute // 1440}")
    out = {}
    for k, v in raw.items():
        m, _, name = k.decode().partition(":")
        if int(m) == minute:
            out[name] = int(v)
    return out


async def test_quiet_minutes_are_zero_and_requests_are_counted(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    base = 28_000_000
    clock = StepClock(base * 60 + 5)
    counters = TrafficCounters(client, clock, flush_s=1.0, models=["m"])  # type: ignore[arg-type]
    counters.count("m", miss=True, prompt_tokens=10, completion_tokens=4)
    counters.count("m", miss=False, prompt_tokens=10, completion_tokens=4)
    assert await counters.flush()
    clock.t += 180  # three quiet minutes later
    assert await counters.flush()
    # the first minute: the router started 5 s into it (partial); then two whole quiet minutes
    # and the one it is still counting (open)
    assert await fields(client, "m", base) == {
        "requests": 2,
        "misses": 1,
        "prompt_tokens": 20,
        "completion_tokens": 8,
        "open": 0,
        "partial": 1,
    }
    for quiet in (base + 1, base + 2):
        assert await fields(client, "m", quiet) == {"requests": 0, "open": 0}
    assert await fields(client, "m", base + 3) == {"requests": 0, "open": 1}
    assert await client.smembers("promptedge:traffic:models") == {b"m"}
    await client.aclose()


async def test_minutes_while_the_router_was_down_stay_empty(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    base = 28_000_000
    first = TrafficCounters(client, StepClock(base * 60), flush_s=1.0, models=["m"])  # type: ignore[arg-type]
    assert await first.flush()
    # A new router process starts ten minutes later: the minutes in between were never counted.
    second = TrafficCounters(client, StepClock((base + 10) * 60), flush_s=1.0, models=["m"])  # type: ignore[arg-type]
    assert await second.flush()
    # the first process never closed its minute (it was gone): still open, never read as demand
    assert await fields(client, "m", base) == {"requests": 0, "open": 1}
    assert await fields(client, "m", base + 5) == {}
    assert await fields(client, "m", base + 10) == {"requests": 0, "open": 1}
    await client.aclose()


async def test_stop_returns_even_if_a_flush_swallows_the_cancellation(redis_url: str) -> None:
    # The cache's index follower hung close() for ever when redis-py swallowed its cancel
    # (cache/semantic/cache.py); the counters' flush loop had the same shape.
    import asyncio

    class Swallowing(TrafficCounters):
        swallowed = 0

        async def flush(self) -> bool:
            if self._task is not None and asyncio.current_task() is self._task and not self.swallowed:
                try:
                    await asyncio.sleep(0.2)
                except asyncio.CancelledError:
                    self.swallowed += 1  # what the library did: the cancel does not reach the loop
                return True
            return await super().flush()

    client = aioredis.Redis.from_url(redis_url)
    counters = Swallowing(client, StepClock(28_000_000 * 60), flush_s=0.01, models=["m"])  # type: ignore[arg-type]
    counters.start()
    await asyncio.sleep(0.05)  # inside the first flush
    async with asyncio.timeout(3):
        await counters.stop()
    assert counters.swallowed == 1
    await client.aclose()


async def test_a_minute_is_whole_only_when_every_worker_closed_it(redis_url: str) -> None:
    """Two workers (processes) count into the same fields: the minute stays open until the
    second one has flushed after it ended; a worker stopped in a minute closes it as partial."""
    client = aioredis.Redis.from_url(redis_url)
    base = 28_000_000
    clock_a, clock_b = StepClock(base * 60), StepClock(base * 60 - 2)  # b's clock 2 s behind
    a = TrafficCounters(client, clock_a, flush_s=1.0, models=["m"])  # type: ignore[arg-type]
    b = TrafficCounters(client, clock_b, flush_s=1.0, models=["m"])  # type: ignore[arg-type]
    clock_b.t += 10
    a.count("m", miss=True, prompt_tokens=0, completion_tokens=0)
    b.count("m", miss=True, prompt_tokens=0, completion_tokens=0)
    assert await a.flush() and await b.flush()
    assert await fields(client, "m", base) == {"requests": 2, "misses": 2, "open": 2}
    clock_a.t += 61
    assert await a.flush()
    assert (await fields(client, "m", base))["open"] == 1  # b is still counting it
    clock_b.t += 52
    assert await b.flush()
    assert await fields(client, "m", base) == {"requests": 2, "misses": 2, "open": 0}
    await a.stop()  # stopped 1 s into the next minute
    assert await fields(client, "m", base + 1) == {"requests": 0, "open": 1, "partial": 1}
    await client.aclose()


async def test_a_minute_whose_counts_were_dropped_is_partial(redis_url: str) -> None:
    """Beyond ``max_pending`` keys (a long Redis outage) the oldest counts are dropped: that
    minute is closed as partial, never read as whole."""
    client = aioredis.Redis.from_url(redis_url)
    base = 28_000_000
    clock = StepClock(base * 60)
    counters = TrafficCounters(client, clock, flush_s=1.0, models=["m"], max_pending=1)  # type: ignore[arg-type]
    good = counters.redis
    counters.redis = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # Redis down
    counters.count("m", miss=False, prompt_tokens=0, completion_tokens=0)
    clock.t += 60
    counters.count("m", miss=False, prompt_tokens=0, completion_tokens=0)
    assert not await counters.flush()
    assert counters.dropped == 1
    await counters.redis.aclose()
    counters.redis = good
    clock.t += 60
    assert await counters.flush()
    assert await fields(client, "m", base) == {"requests": 0, "open": 0, "partial": 1}
    assert await fields(client, "m", base + 1) == {"requests": 1, "open": 0}
    await client.aclose()


async def test_minutes_before_the_router_serves_are_not_counted(redis_url: str) -> None:
    """The counters are made when the router's start-up begins and started when it serves; the
    start-up in between (the embedding model loading: seconds, minutes on a scaled clock) saw
    no request because none could reach it: its minutes are not marked as counted (they read
    as missing, not as 0), and the first minute it serves in is partial."""
    client = aioredis.Redis.from_url(redis_url)
    base = 28_000_000
    clock = StepClock(base * 60 + 10)
    counters = TrafficCounters(client, clock, flush_s=3600.0, models=["m"])  # type: ignore[arg-type]
    clock.t += 150  # loading
    counters.start()  # serving from here, 40 s into base + 2
    counters.count("m", miss=True, prompt_tokens=0, completion_tokens=0)
    clock.t += 60
    await counters.stop()
    assert await fields(client, "m", base) == {} and await fields(client, "m", base + 1) == {}
    assert await fields(client, "m", base + 2) == {"requests": 1, "misses": 1, "open": 0, "partial": 1}
    assert await fields(client, "m", base + 3) == {"requests": 0, "open": 0, "partial": 1}
    await client.aclose()
