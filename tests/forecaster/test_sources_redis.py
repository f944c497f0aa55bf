"""The router's Redis counters read over many days (the loop preloads the days before its
segment): one round trip, one HGETALL per day hash, every minute where the router put it."""

from __future__ import annotations

import numpy as np
import redis

from forecaster.sources import RedisCounterSource


class CountingClient:
    """A real Redis client that records each pipeline's queued commands when it executes."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.round_trips: list[list[str]] = []

    def pipeline(self, transaction: bool = True) -> redis.client.Pipeline:
        pipe = self._client.pipeline(transaction=transaction)
        real_execute = pipe.execute

        def execute() -> list:
            self.round_trips.append([str(args[0]) for args, _ in pipe.command_stack])
            return real_execute()

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)


def test_seven_days_of_minutes_in_one_round_trip(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    days, first = 7, 29_000_000  # a Unix minute; the series starts mid-day
    rates = np.random.default_rng(1).integers(0, 500, days * 1440)
    pipe = client.pipeline(transaction=False)
    for model in ("a", "b"):
        for i, count in enumerate(rates):
            minute = first + i
            pipe.hset(f"promptedge:traffic:{model}:{minute // 1440}", f"{minute}:requests", int(count))
    pipe.sadd("promptedge:traffic:models", "a", "b")
    pipe.execute()
    now = (first + days * 1440) * 60.0 + 30  # inside the first minute after the data
    source = RedisCounterSource(redis_url, None, history_s=days * 86400)
    counting = CountingClient(source._client())
    source._conn = counting  # type: ignore[assignment]
    traffic = source.fetch(now)
    hashes = (first + days * 1440 - 1) // 1440 - first // 1440 + 1
    assert len(counting.round_trips) == 1  # the model list is one call, then one pipeline
    assert counting.round_trips[0] == ["HGETALL"] * (2 * hashes)  # per model, per day hash
    assert traffic.start == first * 60.0 and len(traffic) == days * 1440
    np.testing.assert_allclose(traffic.requests, 2 * rates / 60.0)  # both models summed, per second
