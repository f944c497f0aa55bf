"""The closed loop's warming switch (``python -m sim loop --warming on|off``, sim/loop/run.py
``warming_env``) reaches the real router, and the warming bench's recurring-day history
(bench/loop_warming.py ``RecurringDay``) is history the router's warmer acts on: warm
generations when on, none when off, on the same history and forecast."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache.warming.settings import WarmingSettings
from sim.client.replay import PlannedRequest
from sim.loop.config import LoopConfig
from sim.loop.run import warming_env
from tests.bench_script import load_bench
from tests.router.conftest import MODEL
from tests.router.test_warming import publish, wait_for, warm_count

bench = load_bench("loop_warming")

SPEEDUP = 100.0  # the loop's tick_s is 15 simulated s: 0.15 wall s here
FAST = {"budget_per_min": 600.0, "burst": 10.0, "replica_slots": 2}


@pytest.fixture(autouse=True)
def no_semantic(exact_only: None) -> None:
    """Exact stage only: no embedding model to load (the store path is the same)."""


def history(redis_url: str, text: str) -> tuple[Any, str]:
    """The bench's history for one prompt asked two minutes from now (the forecast's peak) on
    each of the 7 days before; returns the hook and the prompt's exact key."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}
    hook = bench.RecurringDay(MODEL, WarmingSettings(enabled=True, **FAST), SPEEDUP, None)
    now = time.time()
    hook.before_replay(redis_url, now, now, [PlannedRequest(120.0 / SPEEDUP, "new", 8, body)], "predictive")
    return hook, bench.scope_request(body, MODEL)[1]


@pytest.mark.parametrize("warming", [None, FAST])
async def test_the_loops_warming_switch_warms_only_when_on(
    warming, start_replica, start_router, client, redis_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = warming_env(LoopConfig(trace=Path("unused"), speedup=SPEEDUP, warming=warming))
    assert bool(env) == (warming is not None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    hook, key = history(redis_url, "Which GPU serves an 8B model best?")
    store = aioredis.Redis.from_url(redis_url)
    try:
        await publish(store)  # a rise to the pool's capacity two minutes ahead
        router = await start_router([(await start_replica()).url])
        if warming is None:
            await asyncio.sleep(1.0)  # several of the on case's ticks
            assert not await store.exists(key)
            assert await warm_count(client, router, "attempted") == 0.0
        else:
            assert await wait_for(lambda: store.exists(key)), "the recurring prompt was never warmed"
            assert await warm_count(client, router, "stored") == 1.0
        found = hook.after_replay(redis_url, router.url, "predictive")
        assert found["warm_entries_left"] == found["warm_entries_requested"] == (0 if warming is None else 1)
    finally:
        await store.aclose()
