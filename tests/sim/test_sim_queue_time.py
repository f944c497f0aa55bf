"""A real ``python -m sim serve`` replica under a burst exports vLLM's queue-time histogram,
and the loop's scrape arithmetic reads it back: one observation per request, the requests
that could not be admitted at once counted with their wait, in simulated seconds."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from sim.loop.queue_time import Scrape, parse_histogram, queue_time_total
from sim.stack import free_port
from tests.sim.replica_process import start_replica as start_sim_replica

MODEL = "sim-llama-8b"
SCALE = 20.0
# l4: 31,000 KV tokens. Each request reserves 7,500 prompt (ceil(30,000 chars / 4)) + 300
# generated tokens = 7,800, so three run at once and the other three wait in the queue until
# one of the first finishes: at least its 299 decode steps of >= 58 ms, about 17 simulated s.
# Each request's prompt is its own letter: the replica caches prefixes (vLLM's automatic prefix
# caching), and six equal prompts would share their KV blocks and all run at once.
PROMPTS = [letter * 30_000 for letter in "abcdef"]
MAX_TOKENS = 300
BURST = 6
ADMITTED_AT_ONCE = 3
MIN_WAIT_S = 15.0


def start_replica(port: int) -> subprocess.Popen[bytes]:
    return start_sim_replica(port, "--profile", "l4", "--time-scale", str(SCALE))


async def burst(base: str) -> tuple[str, list[int], str]:
    """The /metrics text before the burst, each request's status, the text after."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        before = (await client.get("/metrics")).text
        bodies = [{"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS} for prompt in PROMPTS[:BURST]]
        replies = await asyncio.gather(*(client.post("/v1/completions", json=body) for body in bodies))
        after = (await client.get("/metrics")).text
    return before, [r.status_code for r in replies], after


@pytest.fixture()
def replica() -> Iterator[str]:
    port = free_port()
    proc = start_replica(port)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_a_burst_beyond_the_kv_cache_shows_up_as_queue_time(replica: str) -> None:
    before_text, statuses, after_text = asyncio.run(burst(replica))
    before, after = parse_histogram(before_text), parse_histogram(after_text)
    ttft = parse_histogram(after_text, "vllm:time_to_first_token_seconds")
    assert before is not None and after is not None and ttft is not None
    assert statuses == [200] * BURST
    assert before.count == 0 and after.count == BURST  # one observation per finished request
    cumulative = dict(after.buckets)
    waited = after.count - cumulative[MIN_WAIT_S]
    assert waited >= BURST - ADMITTED_AT_ONCE
    assert after.sum >= (BURST - ADMITTED_AT_ONCE) * MIN_WAIT_S  # simulated seconds, not wall
    assert after.sum < ttft.sum  # each request waited less than it took to its first token
    measured = queue_time_total([Scrape(-1.0, "pod", before), Scrape(1.0, "pod", after)])
    assert measured["requests"] == BURST
    assert measured["mean"] == pytest.approx(after.sum / BURST, abs=1e-4)
    assert measured["p95"] is not None and measured["p95"] > MIN_WAIT_S
    print(
        f"\nqueue time of {BURST} requests: sum {after.sum:.2f} s, mean {measured['mean']} s, "
        f"p95 {measured['p95']} s, {waited:.0f} waited > {MIN_WAIT_S} s; TTFT sum {ttft.sum:.2f} s"
    )
