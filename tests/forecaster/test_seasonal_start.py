"""The loop preloads days of counters before its segment: from its first decision the
forecaster uses the daily shape in them, on 1-minute counters (a 1,440-step season)."""

from __future__ import annotations

import numpy as np
import redis

from forecaster import ForecasterSettings, RedisCounterSource, run_once
from forecaster.plan import replicas_for


def test_three_days_of_minutes_plan_the_morning_ramp_before_it_comes(redis_url: str) -> None:
    """Three days and eight hours of per-minute counts (Poisson) with a ramp from 2 to 10
    requests/s at 08:00-08:30: deciding at 08:00 of day four, the forecaster picks a seasonal
    model and orders more replicas than the demand it sees needs. Model selection judges the
    candidates over the whole last day; over only its last 144 minutes (all before the ramp) a
    level-only model was chosen and the plan stayed at the reactive floor."""
    day = np.r_[np.full(480, 2.0), np.linspace(2.0, 10.0, 30), np.full(930, 10.0)]
    counts = np.random.default_rng(0).poisson(np.tile(day, 4) * 60)
    first_minute = 20_000 * 1440  # a day boundary, so minute 480 of each day is 08:00 UTC
    now_minute = first_minute + 3 * 1440 + 480
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for i in range(now_minute - first_minute):
        minute = first_minute + i
        pipe.hset(f"promptedge:traffic:m:{minute // 1440}", f"{minute}:requests", int(counts[i]))
    pipe.sadd("promptedge:traffic:models", "m")
    pipe.execute()
    settings = ForecasterSettings(redis_url=redis_url, capacity_per_replica=2.0, max_replicas=20, history_s=4 * 86400.0)
    source = RedisCounterSource(redis_url, None, settings.history_s)
    result = run_once(settings, source, now_minute * 60.0)
    assert result.model in ("seasonal_level", "seasonal_naive"), result.note
    seen = counts[now_minute - first_minute - 1] / 60.0
    assert result.decision.replicas > replicas_for(seen, settings.planner()), result.decision.reason
