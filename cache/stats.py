"""Cache outcome counters in Redis, so every router worker adds to the same numbers."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from cache.types import Outcome

_FIELDS = ("requests", "exact_hits", "semantic_hits", "misses")
_OUTCOME_FIELD = {"exact": "exact_hits", "semantic": "semantic_hits", "miss": "misses"}


def summarise(counts: dict[str, int]) -> dict[str, Any]:
    """counts with the four _FIELDS -> the same plus ``hit_ratio`` = hits / requests (0 if none)."""
    out: dict[str, Any] = {f: int(counts.get(f, 0)) for f in _FIELDS}
    hits = out["exact_hits"] + out["semantic_hits"]
    out["hit_ratio"] = hits / out["requests"] if out["requests"] else 0.0
    return out


class StatsStore:
    """Per-model counters: hash ``{prefix}:stats:{model}`` plus the set ``{prefix}:stats:models``."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    async def record(self, model: str, outcome: Outcome) -> None:
        pipe = self._redis.pipeline(transaction=False)
        key = f"{self._prefix}:stats:{model}"
        pipe.hincrby(key, "requests", 1)
        pipe.hincrby(key, _OUTCOME_FIELD[outcome], 1)
        pipe.sadd(f"{self._prefix}:stats:models", model)
        await pipe.execute()

    async def read(self) -> dict[str, Any]:
        """The ``/cache/stats`` JSON: totals and ``per_model`` (each: requests, exact_hits,
        semantic_hits, misses, hit_ratio)."""
        models = sorted(m.decode() if isinstance(m, bytes) else m
                        for m in await self._redis.smembers(f"{self._prefix}:stats:models"))
        pipe = self._redis.pipeline(transaction=False)
        for model in models:
            pipe.hgetall(f"{self._prefix}:stats:{model}")
        rows = await pipe.execute() if models else []
        per_model: dict[str, Any] = {}
        total = dict.fromkeys(_FIELDS, 0)
        for model, row in zip(models, rows):
            counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in row.items()}
            per_model[model] = summarise(counts)
            for f in _FIELDS:
                total[f] += per_model[model][f]
        return {**summarise(total), "per_model": per_model}
