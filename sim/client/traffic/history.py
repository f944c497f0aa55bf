"""Writes per-minute history into the router's Redis traffic counters (layout: top-level
README, "Traffic counters"): hash ``promptedge:traffic:{model}:{day}`` with fields
``{minute}:requests``, ``:misses``, ``:prompt_tokens``, ``:completion_tokens`` (``minute`` =
Unix seconds // 60, ``day`` = minute // 1440), 15-day TTL, and the model in
``promptedge:traffic:models``. Times are on the simulated clock."""

from __future__ import annotations

import redis

COUNTER_TTL_S = 15 * 86400
MODELS_KEY = "promptedge:traffic:models"


def counter_fields(requests: float, miss_ratio: float, mean_tokens: tuple[float, float]) -> dict[str, int]:
    """One minute's counter fields from expected ``requests``: misses = requests x
    ``miss_ratio``, tokens = requests x mean (context, generated) tokens; all rounded."""
    n = int(round(requests))
    return {"requests": n, "misses": int(round(n * miss_ratio)),
            "prompt_tokens": int(round(n * mean_tokens[0])), "completion_tokens": int(round(n * mean_tokens[1]))}


def write_history(client: redis.Redis, model: str, segment_start_unix: float, minutes: list[tuple[int, float]],
                  miss_ratio: float, mean_tokens: tuple[float, float]) -> int:
    """Write ``minutes`` (offset from the segment start, expected requests) as counters of
    ``model`` ending at the simulated Unix time ``segment_start_unix``; returns minutes written.
    Raises redis.RedisError."""
    base = int(segment_start_unix // 60)
    pipe = client.pipeline(transaction=False)
    days: set[int] = set()
    for offset, requests in minutes:
        minute = base + offset
        day = minute // 1440
        days.add(day)
        key = f"promptedge:traffic:{model}:{day}"
        pipe.hset(key, mapping={f"{minute}:{k}": v for k, v in counter_fields(requests, miss_ratio, mean_tokens).items()})
    for day in days:
        pipe.expire(f"promptedge:traffic:{model}:{day}", COUNTER_TTL_S)
    pipe.sadd(MODELS_KEY, model)
    pipe.execute()
    return len(minutes)
