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
    assert await fields(client, "m", base) == {"requests": 2, "misses": 1, "prompt_tokens": 20,
                                               "completion_tokens": 8}
    for quiet in (base + 1, base + 2, base + 3):
        assert await fields(client, "m", quiet) == {"requests": 0}
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
    assert await fields(client, "m", base) == {"requests": 0}
    assert await fields(client, "m", base + 5) == {}
    assert await fields(client, "m", base + 10) == {"requests": 0}
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
