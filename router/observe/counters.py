"""Per-minute traffic counters in Redis, read by the forecaster (layout: docs/contracts.md).

Requests add to an in-process tally (no I/O on the request path); a background task flushes
the tally every ``flush_s`` in one pipelined round trip. Each flush also marks every minute
since the last successful flush with ``HINCRBY {minute}:requests 0`` for every model the router
serves: a field that exists, even at 0, means "the router was up and counted"; a minute without
fields means nobody counted (router down), which the forecaster keeps as missing, not zero. If
Redis is down the tally is kept and merged into the next flush, so minutes are late, not lost
(bounded: beyond ``max_pending`` keys the oldest minutes are dropped and counted in ``dropped``).

Which minutes are whole (issue 31: a router's first minute after a restart, and the minute it is
still counting, read as a demand drop). Every writer (router process) brackets each minute it
counts, per model, on its own clock:

- ``{minute}:open`` +1 on its first flush that writes anything for the minute, before the
  minute's counts in the same pipeline;
- ``{minute}:open`` -1 on its first flush after the minute ended (or on stop), after the
  minute's last counts; with ``{minute}:partial`` +1 too when it did not count the whole minute:
  it started after the minute began, stopped before it ended, or dropped counts of it (beyond
  ``max_pending``).

So ``open`` is the number of writers still counting the minute (flush lag, a clock behind, or a
writer killed in it, which never closes it), and a minute with ``open`` at 0 and no ``partial``
was counted whole by every writer that counted in it. Several writers (workers, routers) add
into the same fields. The forecaster reads only such minutes as demand
(forecaster/sources/redis_counters.py); a minute with counts but no ``open`` field was written
by a router from before these markers (or ``sim``'s history) and is read as before.

Redis Cluster: the keys carry no hash tag on purpose, so each counter hash (one model, one day)
is its own slot and the counters spread over the nodes by model and day. Nothing needs two of
them in one slot: every command touches one key, and the flush is a plain (non-transactional)
pipeline, which a cluster client splits by node; the commands on one key keep their order. The
layout is shared with the forecaster and ``sim``, defined once in opskit (``TRAFFIC_*``), so it
stays as it is on every topology.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import redis.asyncio as aioredis

from opskit import TRAFFIC_KEY as KEY
from opskit import TRAFFIC_MODELS_KEY as MODELS_KEY
from opskit import TRAFFIC_TTL_S as EXPIRE_S
from opskit import traffic_field
from router.errors import RedisUnavailable
from router.redis_errors import redis_failures

log = logging.getLogger("router.counters")


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

    def __init__(
        self, redis: aioredis.Redis, clock: SimClock, flush_s: float, models: list[str], max_pending: int = 100_000
    ) -> None:
        self.redis = redis
        self.models = models
        self.clock = clock
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.dropped = 0
        self._tally: Counter[tuple[str, int, str]] = Counter()
        self._task: asyncio.Task[None] | None = None
        # (model, minute) this writer opened and has not closed; minutes up to _closed are closed.
        self._open: set[tuple[str, int]] = set()
        self._begin(clock.now())
        self._lossy: set[int] = set()  # minutes whose counts _trim dropped: never whole
        self._stopping = False
        self._flushed = False

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
        """Write the tally to Redis in one pipeline; returns False (tally kept) if Redis failed.

        Opens the minutes it writes for the first time and closes those that ended (module doc);
        once ``stop`` began, closes the minute in progress too, as partial."""
        final = self._stopping
        current = int(self.clock.now() // 60)
        # Bounded so a long Redis outage cannot turn into one huge pipeline.
        heartbeat = range(max(self._marked + 1, current - 1440), current + 1)
        if not self._tally and not heartbeat and not final:
            return True
        tally, self._tally = self._tally, Counter()
        opens = {(model, minute) for model in self.models for minute in heartbeat}
        # a minute already closed (the clock went back) gets its counts, never a second bracket
        opens.update((model, minute) for model, minute, _ in tally if minute > self._closed)
        opens -= self._open
        last = current if final else current - 1
        closes = {pair for pair in self._open | opens if pair[1] <= last}
        pipe = self.redis.pipeline(transaction=False)
        keys, models = set(), set(self.models)
        # order on each key: open, counts, close (a reader never sees a closed minute without its counts)
        for model, minute in sorted(opens):
            key = KEY.format(model=model, day=minute // 1440)
            pipe.hincrby(key, traffic_field(minute, "open"), 1)
            pipe.hincrby(key, f"{minute}:requests", 0)
            keys.add(key)
        for (model, minute, field), value in tally.items():
            key = KEY.format(model=model, day=minute // 1440)
            pipe.hincrby(key, f"{minute}:{field}", value)
            keys.add(key)
            models.add(model)
        for model, minute in sorted(closes):
            key = KEY.format(model=model, day=minute // 1440)
            pipe.hincrby(key, traffic_field(minute, "open"), -1)
            if not self._whole(minute, current, final):
                pipe.hincrby(key, traffic_field(minute, "partial"), 1)
            keys.add(key)
        for key in keys:
            pipe.expire(key, EXPIRE_S)
        if models:
            pipe.sadd(MODELS_KEY, *models)
        try:
            with redis_failures():
                await pipe.execute()
        except RedisUnavailable as exc:
            log.warning("traffic counters not written (kept for the next flush): %s", exc)
            tally.update(self._tally)
            self._tally = tally
            self._trim()
            return False
        self._marked = current
        self._open = (self._open | opens) - closes
        self._closed = max(self._closed, last)
        self._lossy = {minute for minute in self._lossy if minute > last}
        self._flushed = True
        return True

    def _whole(self, minute: int, current: int, final: bool) -> bool:
        """Whether this writer counted all of ``minute``: up from its start, not stopped in it,
        none of its counts dropped."""
        return minute * 60 >= self._started and not (final and minute == current) and minute not in self._lossy

    def _trim(self) -> None:
        if len(self._tally) <= self.max_pending:
            return
        for key in sorted(self._tally, key=lambda k: k[1])[: len(self._tally) - self.max_pending]:
            self.dropped += self._tally.pop(key)
            self._lossy.add(key[1])

    def _begin(self, at: float) -> None:
        # Counted from ``at`` (simulated Unix s): minutes before it are never marked, its own is partial.
        self._started = at
        first = int(at // 60)
        # Minutes up to this one are marked as counted; a restarted router starts at its first minute.
        self._marked = first - 1
        self._closed = first - 1

    def start(self) -> None:
        """Start flushing every ``flush_s`` in the background. Called when the router starts
        serving: the minutes of its start-up before it (no request could reach it) are never
        marked as counted, and the minute it starts in is partial."""
        if not self._flushed and not self._tally:  # nothing counted or written yet: nothing to keep
            self._begin(self.clock.now())
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop the background task and flush what is left (once), closing the minute in
        progress as partial (the process that takes over counts the rest of it)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._stopping = True
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
