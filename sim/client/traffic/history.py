"""Writes per-minute history into the router's Redis traffic counters (layout: opskit's
``TRAFFIC_*``, docs/contracts.md): hash ``promptedge:traffic:{model}:{day}`` with fields
``{minute}:requests``, ``:misses``, ``:prompt_tokens``, ``:completion_tokens`` (``minute`` =
Unix seconds // 60, ``day`` = minute // 1440), 15-day TTL, and the model in
``promptedge:traffic:models``. Times are on the simulated clock."""

from __future__ import annotations

import redis

from opskit import TRAFFIC_MODELS_KEY as MODELS_KEY
from opskit import TRAFFIC_TTL_S as COUNTER_TTL_S
from opskit import traffic_field, traffic_key


def counter_fields(requests: float, miss_ratio: float, mean_tokens: tuple[float, float]) -> dict[str, int]:
    """One minute's counter fields from expected ``requests``: misses = requests x
    ``miss_ratio``, tokens = requests x mean (context, generated) tokens; all rounded."""
    n = int(round(requests))
    return {
        "requests": n,
        "misses": int(round(n * miss_ratio)),
        "prompt_tokens": int(round(n * mean_tokens[0])),
        "completion_tokens": int(round(n * mean_tokens[1])),
    }


def write_history(
    client: redis.Redis,
    model: str,
    segment_start_unix: float,
    minutes: list[tuple[int, float]],
    miss_ratio: float,
    mean_tokens: tuple[float, float],
) -> int:
    """Write ``minutes`` (offset from the segment start, expected requests) as counters of
    ``model`` ending at the simulated Unix time ``segment_start_unix``; returns minutes written.
    Raises redis.RedisError."""
    base = int(segment_start_unix // 60)
    pipe = client.pipeline(transaction=False)
    keys: set[str] = set()
    for offset, requests in minutes:
        minute = base + offset
        key = traffic_key(model, minute)
        keys.add(key)
        pipe.hset(
            key,
            mapping={traffic_field(minute, k): v for k, v in counter_fields(requests, miss_ratio, mean_tokens).items()},
        )
    for key in sorted(keys):
        pipe.expire(key, COUNTER_TTL_S)
    pipe.sadd(MODELS_KEY, model)
    pipe.execute()
    return len(minutes)
