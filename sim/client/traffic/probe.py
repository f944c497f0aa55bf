"""A closed-loop probe of an OpenAI endpoint for fault runs (a Redis failover under traffic):
``concurrency`` clients each send the next of a fixed set of chat prompts as soon as the last
answer arrived, recording status, ``X-Cache`` and the answer's ``id`` of every request.

An answer's ``id`` is unique per generation (a replica makes a new one each time), so a cache hit
is right only if its ``id`` is one that a miss *of the same prompt* produced: :func:`wrong_hits`
finds hits that fail that (another prompt's answer, or one nobody generated). :func:`phases`
summarises a run around a fault at ``fault_t``: before it, the outage (fault -> first cache hit
after it) and after, each with requests, hits, misses, errors and latency p50/p99 (ms).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Sample:
    """One request: ``t`` (monotonic s at the answer), ``prompt`` (index), ``status`` (0: no HTTP
    answer), ``cache`` (``X-Cache``: exact, semantic, miss, or "" when absent), ``answer_id``
    (the body's ``id``, "" when none), ``latency_s``, ``error`` (transport error class or None)."""

    t: float
    prompt: int
    status: int
    cache: str
    answer_id: str
    latency_s: float
    error: str | None = None

    @property
    def hit(self) -> bool:
        return self.status == 200 and self.cache in ("exact", "semantic")


def chat_prompts(model: str, n: int) -> list[dict[str, Any]]:
    """``n`` distinct short chat requests for ``model`` (greedy, 8 tokens: cacheable)."""
    return [
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Failover probe question {i}?"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        for i in range(n)
    ]


async def probe(
    url: str,
    prompts: Sequence[dict[str, Any]],
    stop: asyncio.Event,
    concurrency: int = 4,
    timeout_s: float = 10.0,
    samples: list[Sample] | None = None,
) -> list[Sample]:
    """Send ``prompts`` round robin from ``concurrency`` loops to ``url`` (a chat completions URL)
    until ``stop`` is set; returns every request's Sample in answer order. Never raises for a
    failed request (it is a Sample with its error). ``samples``: the list to append to, so a
    caller can watch the answers arrive (e.g. wait for hits before a fault) instead of a
    fixed sleep."""
    samples = [] if samples is None else samples
    turn = 0

    async def loop(client: httpx.AsyncClient) -> None:
        nonlocal turn
        while not stop.is_set():
            index = turn % len(prompts)
            turn += 1
            started = time.monotonic()
            try:
                response = await client.post(url, json=prompts[index])
            except httpx.HTTPError as exc:
                samples.append(
                    Sample(time.monotonic(), index, 0, "", "", time.monotonic() - started, type(exc).__name__)
                )
                continue
            try:
                answer_id = str(response.json().get("id", ""))
            except ValueError:
                answer_id = ""
            samples.append(
                Sample(
                    time.monotonic(),
                    index,
                    response.status_code,
                    response.headers.get("x-cache", ""),
                    answer_id,
                    time.monotonic() - started,
                )
            )

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        await asyncio.gather(*(loop(client) for _ in range(concurrency)))
    return samples


def wrong_hits(samples: Sequence[Sample], generated: dict[int, set[str]] | None = None) -> list[Sample]:
    """Hits whose answer no miss of the same prompt produced (pure). ``generated``: answer ids
    per prompt produced before the samples (seeding); the samples' own misses are added."""
    made: dict[int, set[str]] = {k: set(v) for k, v in (generated or {}).items()}
    for s in samples:
        if s.status == 200 and s.cache == "miss":
            made.setdefault(s.prompt, set()).add(s.answer_id)
    return [s for s in samples if s.hit and s.answer_id not in made.get(s.prompt, set())]


def _quantile_ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] * 1000, 1)


def _summary(name: str, rows: list[Sample], start: float, end: float) -> dict[str, Any]:
    latencies = [s.latency_s for s in rows]
    return {
        "phase": name,
        "seconds": round(end - start, 2),
        "requests": len(rows),
        "hits": sum(s.hit for s in rows),
        "misses": sum(s.status == 200 and s.cache == "miss" for s in rows),
        "errors": sum(s.status != 200 for s in rows),
        "p50_ms": _quantile_ms(latencies, 0.5),
        "p99_ms": _quantile_ms(latencies, 0.99),
    }


def phases(samples: Sequence[Sample], started: float, fault_t: float, ended: float) -> list[dict[str, Any]]:
    """Per phase (``before``: start -> fault; ``outage``: fault -> the first hit after the first
    request the fault turned into a non-hit, the seconds without cache hits; ``after``: -> end)
    the requests, hits, misses, errors (any status but 200, or no answer) and latency p50/p99 in
    ms (pure). Hits of requests already past the cache when the fault struck do not end the
    outage. Without a hit after it, ``outage`` runs to the end and ``after`` is empty; without
    any non-hit after the fault, ``outage`` is empty."""
    lost = [s.t for s in samples if s.t > fault_t and not s.hit]
    if not lost:
        recovered = fault_t
    else:
        back = [s.t for s in samples if s.t > min(lost) and s.hit]
        recovered = min(back) if back else ended
    return [
        _summary("before", [s for s in samples if s.t <= fault_t], started, fault_t),
        _summary("outage", [s for s in samples if fault_t < s.t < recovered], fault_t, recovered),
        _summary("after", [s for s in samples if s.t >= recovered], recovered, ended),
    ]
