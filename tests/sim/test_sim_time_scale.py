"""``time_scale``: the replica runs X simulated seconds per wall second, and reports simulated ones."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import FAST

MODEL = "sim-llama-8b"
# 0.5 s per decode step: 4 tokens take 2 simulated seconds, whatever the machine does.
SLOW = dataclasses.replace(FAST, name="slow", decode_base_s=0.5)


def histogram_sums(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name.endswith("_sum")}


async def test_steps_run_faster_while_metrics_stay_in_simulated_seconds(serve_replica) -> None:
    url = await serve_replica(profile=SLOW, time_scale=100.0)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        started = time.monotonic()
        reply = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4})
        wall = time.monotonic() - started
        sums = histogram_sums((await client.get("/metrics")).text)
    assert reply.status_code == 200
    # unscaled, the four 0.5 s steps alone would sleep 2 wall seconds
    assert wall < 1.5
    # the replica reports the simulated durations: four steps of 0.5 s at least
    assert sums["vllm:e2e_request_latency_seconds_sum"] >= 2.0
    assert sums["vllm:time_to_first_token_seconds_sum"] >= 0.5


async def test_warm_up_is_in_simulated_seconds(serve_replica) -> None:
    url = await serve_replica(warmup_s=60.0, time_scale=20.0)  # 3 wall seconds
    async with httpx.AsyncClient(base_url=url) as client:
        first = await client.get("/health")
        deadline = time.monotonic() + 30
        while (await client.get("/health")).status_code != 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        last = await client.get("/health")
    assert first.status_code == 503 and first.json() == {"status": "warming_up"}
    assert last.status_code == 200  # unscaled it would take 60 wall seconds


async def test_warm_up_counts_from_warmup_from_not_from_the_engine_start(serve_replica) -> None:
    # a node launched the process "2 wall seconds ago": at 30x that is all of a 60 s warm-up
    url = await serve_replica(warmup_s=60.0, time_scale=30.0, warmup_from=time.time() - 2.0)
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/health")).status_code == 200
