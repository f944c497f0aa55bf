"""Per-minute traffic counters in Redis, read by the forecaster (layout: docs/contracts.md).

Requests add to an in-process tally (no I/O on the request path); a background task flushes
the tally every ``flush_s`` in one pipelined round trip. Each flush also marks every minute
since the last successful flush with ``HINCRBY {minute}:requests 0`` for every model the router
serves: a field that exists, even at 0, means "the router was up and counted"; a minute without
fields means nobody counted (router down), which the forecaster keeps as missing, not zero. If
Redis is down the tally is kept and merged into the next flush, so minutes are late, not lost
(bounded: beyond ``max_pending`` keys the oldest minutes are dropped and counted in ``dropped``).

Redis Cluster: the keys carry no hash tag on purpose, so each counter hash (one model, one day)
is its own slot and the counters spread over the nodes by model and day. Nothing needs two of
them in one slot: every command touches one key, and the flush is a plain (non-transactional)
pipeline, which a cluster client splits by node. The layout is shared with the forecaster and
``sim`` (README.md), so it stays as it is on every topology.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import redis.asyncio as aioredis

from opskit.redis_client import REDIS_ERRORS

log = logging.getLogger("router.counters")

KEY = "promptedge:traffic:{model}:{day}"
MODELS_KEY = "promptedge:traffic:models"
EXPIRE_S = 15 * 86400


class SimClock:
    """The router's (possibly time-compressed) clock: origin + (time.time() - origin) * scale.

    origin: Unix seconds (default: when the clock was made); scale: speed-up factor
    (1.0 = real time, then the clock is exactly time.time()).
    """

    def __init__(self, origin: float | None, scale: float) -> None:
        self.origin = time.time() if origin is None else origin
        self.scale = scale

    def now(self) -> float:
        """Current simulated Unix time in seconds."""
        real = time.time()
        return real if self.scale == 1.0 else self.origin + (real - self.origin) * self.scale


class TrafficCounters:
    """Counts requests, misses and tokens per model and (simulated) Unix minute."""

    def __init__(self, redis: aioredis.Redis, clock: SimClock, flush_s: float, models: list[str],
                 max_pending: int = 100_000) -> None:
        self.redis = redis
        self.models = models
        self.clock = clock
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.dropped = 0
        self._tally: Counter[tuple[str, int, str]] = Counter()
        self._task: asyncio.Task[None] | None = None
        # Minutes up to this one are marked as counted; a restarted router starts at its first minute.
        self._marked = int(clock.now() // 60) - 1

    def count(self, model: str, *, miss: bool, prompt_tokens: int, completion_tokens: int) -> None:
        """Add one request (and its token usage) to the current minute of ``model``."""
        minute = int(self.clock.now() // 60)
        tally = self._tally
        tally[(model, minute, "requests")] += 1
        if miss:
            tally[(model, minute, "misses")] += 1
        if prompt_tokens:
            tally[(model, minute, "prompt_tokens")] += prompt_tokens
        if completion_tokens:
            tally[(model, minute, "completion_tokens")] += completion_tokens

    async def flush(self) -> bool:
        """Write the tally to Redis in one pipeline; returns False (tally kept) if Redis failed."""
        current = int(self.clock.now() // 60)
        # Bounded so a long Redis outage cannot turn into one huge pipeline.
        heartbeat = range(max(self._marked + 1, current - 1440), current + 1)
        if not self._tally and not heartbeat:
            return True
        tally, self._tally = self._tally, Counter()
        pipe = self.redis.pipeline(transaction=False)
        keys, models = set(), set(self.models)
        for model in self.models:
            for minute in heartbeat:
                key = KEY.format(model=model, day=minute // 1440)
                pipe.hincrby(key, f"{minute}:requests", 0)
                keys.add(key)
        for (model, minute, field), value in tally.items():
            key = KEY.format(model=model, day=minute // 1440)
            pipe.hincrby(key, f"{minute}:{field}", value)
            keys.add(key)
            models.add(model)
        for key in keys:
            pipe.expire(key, EXPIRE_S)
        if models:
            pipe.sadd(MODELS_KEY, *models)
        try:
            await pipe.execute()
        except REDIS_ERRORS as exc:
            log.warning("traffic counters not written (kept for the next flush): %r", exc)
            tally.update(self._tally)
            self._tally = tally
            self._trim()
            return False
        self._marked = current
        return True

    def _trim(self) -> None:
        if len(self._tally) <= self.max_pending:
            return
        for key in sorted(self._tally, key=lambda k: k[1])[: len(self._tally) - self.max_pending]:
            self.dropped += self._tally.pop(key)

    def start(self) -> None:
        """Start flushing every ``flush_s`` in the background."""
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop the background task and flush what is left (once)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()

    async def _loop(self) -> None:
        task = asyncio.current_task()
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()
            # a library that swallows a cancel (redis-py did, cache/semantic/cache.py) must not keep
            # the loop going: stop() awaits it
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
