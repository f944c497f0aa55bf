"""The simulated GPU keeps the latency model's pace when the host CPU is busy.

Each engine step sleeps until a deadline on a step clock, not for the step's duration from
whenever the loop got round to it: otherwise every late wake-up (a loaded 2-core machine, other
coroutines of the same loop) adds up, and on a compressed clock (x6 in the closed loop) a replica
ran 10-35 % slower than its profile, so even a fleet sized for the peak missed the TTFT SLO.
"""

from __future__ import annotations

import asyncio
import time

from sim.replica.engine import Engine, step_start
from sim.replica.latency.batch import simulate
from sim.replica.latency.profiles import get_profile


def test_late_wake_ups_do_not_add_up() -> None:
    end = None
    now = 0.0
    for _ in range(100):  # 100 steps of 10 ms, each woken 3 ms late
        end = step_start(end, now, max_lag_s=0.5) + 0.010
        now = end + 0.003
    assert abs(end - 1.0) < 1e-9


def test_an_idle_engine_starts_its_step_clock_from_now() -> None:
    assert step_start(None, 5.0, max_lag_s=0.5) == 5.0


def test_a_stall_longer_than_the_lag_bound_is_not_caught_up_in_a_burst() -> None:
    # a replica frozen for 30 s (SIGSTOP in the fault tests) resumes at most max_lag behind
    assert step_start(1.0, 31.0, max_lag_s=0.5) == 30.5


async def test_a_busy_event_loop_does_not_slow_the_simulated_gpu() -> None:
    profile = get_profile("l4")
    scale = 4.0
    engine = Engine(profile, "m", time_scale=scale)
    engine.start()
    done = asyncio.Event()

    async def hog() -> None:
        # Another coroutine holds the loop 8 ms at a time: each engine wake-up is late by up to 8 ms
        # against 14.5 ms wall per decode step.
        while not done.is_set():
            time.sleep(0.008)
            await asyncio.sleep(0)

    hogger = asyncio.create_task(hog())
    started = asyncio.get_running_loop().time()
    handle = engine.submit(200, 64)
    await handle.done.wait()
    measured = (asyncio.get_running_loop().time() - started) * scale
    done.set()
    await hogger
    await engine.stop()
    modelled = simulate(profile, [(0.0, 200, 64)])[0].e2e_s
    # Without the step clock: 8.6 simulated s against the model's 3.8.
    assert measured < modelled * 1.10, (measured, modelled)


async def test_a_request_arriving_while_the_step_clock_lags_has_no_negative_queue_time() -> None:
    # The step clock runs up to max_lag behind the loop: a request that arrives after the last
    # step's end but before the engine wakes is admitted by a step that "started" before it
    # arrived. Its queue time must be 0, not negative: a falling vllm:request_queue_time_seconds
    # _sum reads as a counter reset to the closed loop's scrapes (sim/loop/queue_time.py), which
    # then counted the whole histogram again at every scrape (found by a new user's loop run).
    engine = Engine(get_profile("l4"), "m", time_scale=7.0)
    engine.start()
    try:
        first = engine.submit(100, 40)
        await asyncio.sleep(0.02)  # decoding: the engine sleeps until each step's end
        for i in range(5):
            time.sleep(0.01)  # the loop is held past the step's end; the engine has not woken yet
            late = engine.submit(50 + i, 4)
            await late.done.wait()
        await first.done.wait()
    finally:
        await engine.stop()
    text = engine.metrics.render().decode()
    total = next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:request_queue_time_seconds_sum")
    )
    assert total >= 0.0
    assert total < 1.0  # nothing waited for KV room here: queue time is the step boundary at most
