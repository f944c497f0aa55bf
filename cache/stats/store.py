"""Cache outcome counters in Redis, so every router worker adds to the same numbers.

Layout (``{prefix}`` = settings.key_prefix):

| key | type | content | TTL |
|---|---|---|---|
| ``{prefix}:{stats}:all`` | hash | all-time counters | none |
| ``{prefix}:{stats}:b:{t // 10}`` | hash | the same counters for one 10-second bucket (Unix s ``t``) | 3,700 s |

A field is ``{group}|{counter}``: group ``*`` (everything), ``m={model}`` (the pool that
answered) or ``t={tenant label}`` (``CacheRequest.label``: a bounded set, the router folds API
keys without a mapping into ``other``, so random keys cannot grow the hashes);
counters ``requests``, ``exact_hits``, ``semantic_hits``, ``misses``, ``tokens_saved`` (prompt +
completion tokens of the responses served from cache), ``replica_s_saved`` (float, see
CacheSettings), ``sim:{x.xx}`` (semantic hits with similarity in [x.xx, x.xx + 0.01)); group
``*`` also has ``skip:{reason}`` (requests the semantic stage could not judge) and
``reject:{reason}`` (entries found but not served: a verification rule, ``stale``, ``corrupt``). Windows of 1 min,
5 min and 1 h sum the newest 6, 30 and 360 buckets.

Redis Cluster: one script adds to the all-time hash and a bucket together, and a read takes the
all-time hash and 360 buckets in one pipeline, so every stats key carries the tag ``{stats}``
(one slot, one node, one round trip). The counters are a few kilobytes, written at most once per
worker per event-loop turn: one slot holds them easily.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from cache.types import Outcome

_FIELDS = ("requests", "exact_hits", "semantic_hits", "misses")
_OUTCOME_FIELD = {"exact": "exact_hits", "semantic": "semantic_hits", "miss": "misses"}
BUCKET_S = 10
WINDOWS = {"1m": 6, "5m": 30, "1h": 360}
_BUCKET_TTL_S = 3700


@dataclass(frozen=True)
class LookupEvent:
    """One counted lookup. tokens_saved / replica_s_saved are zero for a miss; similarity only
    for a semantic hit; skipped: why the semantic stage did not run (None when it ran or the
    exact stage hit); rejected: candidates not served, by reason."""

    model: str
    tenant: str
    outcome: Outcome
    similarity: float | None = None
    tokens_saved: int = 0
    replica_s_saved: float = 0.0
    skipped: str | None = None
    rejected: Counter[str] = field(default_factory=Counter)


def summarise(counts: dict[str, float]) -> dict[str, Any]:
    """Counters of one group -> requests, exact_hits, semantic_hits, misses, hit_ratio (0 if no
    requests), tokens_saved, replica_seconds_saved, similarity_histogram {bucket: hits}."""
    out: dict[str, Any] = {f: int(counts.get(f, 0)) for f in _FIELDS}
    hits = out["exact_hits"] + out["semantic_hits"]
    out["hit_ratio"] = hits / out["requests"] if out["requests"] else 0.0
    out["tokens_saved"] = int(counts.get("tokens_saved", 0))
    out["replica_seconds_saved"] = round(float(counts.get("replica_s_saved", 0.0)), 3)
    out["similarity_histogram"] = {name[4:]: int(v) for name, v in sorted(counts.items()) if name.startswith("sim:")}
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def report(fields: dict[str, float]) -> dict[str, Any]:
    """Flat ``{group}|{counter}`` fields -> the totals, ``per_model``, ``per_tenant``,
    ``semantic_skipped`` and ``rejected``."""
    groups: dict[str, dict[str, float]] = {}
    for name, value in fields.items():
        group, _, counter = name.rpartition("|")
        groups.setdefault(group, {})[counter] = value
    total = groups.get("*", {})
    out = summarise(total)
    out["per_model"] = {g[2:]: summarise(c) for g, c in sorted(groups.items()) if g.startswith("m=")}
    out["per_tenant"] = {g[2:]: summarise(c) for g, c in sorted(groups.items()) if g.startswith("t=")}
    out["semantic_skipped"] = {k[5:]: int(v) for k, v in sorted(total.items()) if k.startswith("skip:")}
    out["rejected"] = {k[7:]: int(v) for k, v in sorted(total.items()) if k.startswith("reject:")}
    return out


def event_fields(event: LookupEvent) -> tuple[dict[str, int], dict[str, float]]:
    """The integer and float field increments one event adds (pure)."""
    ints: Counter[str] = Counter()
    floats: dict[str, float] = {}
    for group in ("*", f"m={event.model}", f"t={event.tenant}"):
        ints[f"{group}|requests"] += 1
        ints[f"{group}|{_OUTCOME_FIELD[event.outcome]}"] += 1
        if event.outcome != "miss":
            ints[f"{group}|tokens_saved"] += event.tokens_saved
            floats[f"{group}|replica_s_saved"] = event.replica_s_saved
        if event.similarity is not None:
            bucket = math.floor(max(0.0, min(event.similarity, 1.0)) * 100) / 100
            ints[f"{group}|sim:{bucket:.2f}"] += 1
    if event.skipped:
        ints[f"*|skip:{event.skipped}"] += 1
    for reason, n in event.rejected.items():
        ints[f"*|reject:{reason}"] += n
    return dict(ints), floats


# One command per bucket instead of dozens: the increments of the all-time hash and of the
# 10-second bucket, then the bucket's expiry. ARGV: bucket TTL, then (type, field, amount)*.
_RECORD_LUA = """
for i = 2, #ARGV, 3 do
  local cmd = ARGV[i] == 'f' and 'HINCRBYFLOAT' or 'HINCRBY'
  redis.call(cmd, KEYS[1], ARGV[i + 1], ARGV[i + 2])
  redis.call(cmd, KEYS[2], ARGV[i + 1], ARGV[i + 2])
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
"""


class PendingCounts:
    """Counter increments of lookups not yet written to Redis, merged per 10-second bucket.

    ``add(event, now)`` folds an event in (now: Unix s); ``take()`` hands over everything and
    empties it, as {bucket start (Unix s, multiple of BUCKET_S): (int increments, float
    increments)}; ``restore(taken)`` folds a taken batch back (its write failed). Memory is
    bounded by the distinct fields (groups x counters) per bucket, not by the number of events.
    Pure: no I/O.
    """

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[Counter[str], Counter[str]]] = {}

    def __bool__(self) -> bool:
        return bool(self._buckets)

    def add(self, event: LookupEvent, now: float) -> None:
        ints, floats = event_fields(event)
        self._merge(int(now // BUCKET_S) * BUCKET_S, ints, floats)

    def _merge(self, bucket: int, ints: dict[str, int], floats: dict[str, float]) -> None:
        held_ints, held_floats = self._buckets.setdefault(bucket, (Counter(), Counter()))
        held_ints.update(ints)
        held_floats.update({k: v for k, v in floats.items() if v})

    def take(self) -> dict[int, tuple[Counter[str], Counter[str]]]:
        taken, self._buckets = self._buckets, {}
        return taken

    def restore(self, taken: dict[int, tuple[Counter[str], Counter[str]]]) -> None:
        for bucket, (ints, floats) in taken.items():
            self._merge(bucket, ints, floats)


class StatsStore:
    """Reads and writes the counters above; redis errors propagate to the caller."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix
        self._all = f"{prefix}:{{stats}}:all"  # the module doc's hash tag: every key in one slot
        self._bucket = f"{prefix}:{{stats}}:b:"
        self._record = redis.register_script(_RECORD_LUA)

    def _script_input(
        self, bucket_t: float, ints: dict[str, int], floats: dict[str, float]
    ) -> tuple[list[str], list[str | int | float]]:
        args: list[str | int | float] = [_BUCKET_TTL_S]
        for name, n in ints.items():
            args += ["i", name, n]
        for name, x in floats.items():
            if x:
                args += ["f", name, repr(x)]
        return [self._all, f"{self._bucket}{int(bucket_t // BUCKET_S)}"], args

    async def record_pending(self, taken: dict[int, tuple[Counter[str], Counter[str]]]) -> None:
        """Add a ``PendingCounts.take()`` batch: one script call per bucket (usually one; each
        also adds to the all-time hash, so every increment is counted there once). A bucket is
        removed from ``taken`` once written, so after a failure ``taken`` holds what is not in
        Redis yet. Raises redis errors."""
        for bucket in sorted(taken):
            ints, floats = taken[bucket]
            keys, args = self._script_input(bucket, ints, floats)
            await self._record(keys=keys, args=args)
            del taken[bucket]

    async def read(self, now: float | None = None) -> dict[str, Any]:
        """The ``/cache/stats`` JSON: all-time totals at the top level (requests, exact_hits,
        semantic_hits, misses, hit_ratio, tokens_saved, replica_seconds_saved,
        similarity_histogram, per_model, per_tenant, semantic_skipped, rejected) and
        ``windows`` {"1m", "5m", "1h", "all"}, each of the same shape."""
        now = time.time() if now is None else now
        newest = int(now // BUCKET_S)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(self._all)
        for i in range(WINDOWS["1h"]):
            pipe.hgetall(f"{self._bucket}{newest - i}")
        rows = [{_text(k): float(v) for k, v in row.items()} for row in await pipe.execute()]
        all_time = report(rows[0])
        windows: dict[str, Any] = {}
        for name, n in WINDOWS.items():
            summed: Counter[str] = Counter()
            for row in rows[1 : 1 + n]:
                summed.update(row)
            windows[name] = report(dict(summed))
        windows["all"] = {k: v for k, v in all_time.items()}
        return {**all_time, "windows": windows}
