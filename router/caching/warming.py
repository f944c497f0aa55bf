"""Predictive cache warming, the router's part (issue 14 item 4; cache/README.md, "Predictive
warming"): before a forecast peak, regenerate the expired entries that were hot in the same
time-of-day slot on earlier days, while the pool is idle, at a budgeted rate.

One background task per pool with warming on (``CacheSettings.warming_for``), started and
stopped by the app's lifespan. Each step:

1. hold the pool's lock (``SET NX EX``, renewed by its holder): of several router workers, one
   warms a pool at a time;
2. read the forecaster's published forecast (``FORECAST_KEY``, JSON v1, written by the
   forecaster's live cycle; key and document are opskit's, which both sides import; the
   pool's own, else ``"*"``, the sum over pools) and ask the planner (cache/warming/plan.py
   ``peak_slot``) for the slot to warm for;
3. read that slot's candidates on the earlier days with their entries' remaining TTL
   (cache/warming/popularity.py) and ``choose`` the keys to regenerate (once per ``tick_s``);
4. regenerate one key when the budget's token bucket (``allowance``) has a token and the pool
   is idle (``idle``: requests open on its eligible replicas / (replicas x ``replica_slots``)
   below ``idle_load``): the same path as a client's miss (dispatch, the upstream call with its
   retries and health evidence, the replica's ``Cache-Control``, the cache's store with the
   request's own key and scope, semantic entry included), at priority P2, not counted as demand
   (the forecaster's counters hold what clients asked) nor as a client request.

A failed warm generation (replica error, timeout, an answer the cache refuses) is logged,
counted and never cached; that key is not tried again for the same slot. Counted in
``promptedge_router_warm_generations_total{pool,outcome}`` (attempted, stored, failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import Counter

from cache import (
    CacheSettings,
    Recipe,
    ResponseCache,
    WarmingSettings,
    WarmPolicy,
    allowance,
    choose,
    exact_key,
    idle,
    lock_key,
    peak_slot,
    wait_s,
)
from opskit import ALL_POOLS, FORECAST_KEY, MAX_FORECAST_BYTES, Forecast, read_forecast
from router.caching import policy as cachepolicy
from router.dispatch import estimated_requests
from router.errors import APIError, RedisUnavailable
from router.forward import classify
from router.forward.forwarder import Forwarder
from router.observe.record import Record
from router.redis_errors import redis_failures
from router.stream.sse import parse_json

log = logging.getLogger("router.warming")

PRIORITY = "P2"  # warming runs at the lowest class: its timeouts, and it is first to be shed

# KEYS[1] the pool's lock; ARGV: holder id, ttl s. 1 when held by this holder (taken or renewed).
_LOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
return 0
"""
# KEYS[1] the pool's lock; ARGV[1] holder id. Deleted only when this holder still holds it.
_UNLOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RELEASE_TIMEOUT_S = 1.0  # giving the lock back on shutdown: at most this long (else it expires)
_PATHS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


def parse_forecast(raw: str | bytes | None) -> Forecast | None:
    """The forecaster's JSON document (v1), or None when absent, of another version or malformed
    (warming then does nothing: an optimisation never guesses). See ``read_forecast``."""
    return read_forecast(raw)[0]


def _kind(exc: BaseException) -> str:
    """The class name of what failed, for a log line: redis-py's (or the socket's) under a
    RedisUnavailable."""
    return exc.kind if isinstance(exc, RedisUnavailable) else exc.__class__.__name__


def pool_load(forwarder: Forwarder, pool: str, now: float, replica_slots: int) -> tuple[float, float]:
    """(requests open on the pool's eligible replicas, replicas x ``replica_slots``): the
    scraped running + waiting where fresh, else this worker's own in-flight counts."""
    replicas = forwarder.pools.eligible(pool, now)
    busy = sum(estimated_requests(r.view(now), forwarder.weights) for r in replicas)
    return busy, float(len(replicas) * replica_slots)


@dataclass(frozen=True)
class WarmingDeps:
    """What warming uses: ``forwarder``, the miss path a warm generation takes (dispatch, the
    upstream call, storing) and the pools' load; ``redis``, the pools' locks and the published
    forecasts; ``cache``, its popularity counts, recipes, TTLs and settings; ``generations``,
    ``promptedge_router_warm_generations_total`` labelled (pool, outcome)."""

    forwarder: Forwarder
    redis: aioredis.Redis
    cache: ResponseCache
    generations: Counter


@dataclass
class _Plan:
    """The keys chosen for one slot, and when they were chosen (router clock, s)."""

    slot: tuple[float, float]
    keys: list[str]
    at: float
    done: set[str] = field(default_factory=set)


class PoolWarmer:
    """The warming loop of one pool (module doc). ``clock``: the router's clock (Unix s, maybe
    simulated, ``scale`` times real time)."""

    def __init__(
        self, deps: WarmingDeps, pool: str, clock: Any, scale: float = 1.0, stopping: asyncio.Event | None = None
    ) -> None:
        self.deps = deps
        self.pool = pool
        self.stopping = stopping or asyncio.Event()  # set by Warmer.stop: end even if a cancel is lost
        self.clock = clock
        self.scale = scale
        self.holder = os.urandom(8).hex()
        self.tokens = 0.0
        self.last_refill: float | None = None
        self.plan: _Plan | None = None
        self._forecast_problems: dict[str, str] = {}  # forecast key -> why unusable, last logged
        self.holding = False  # this worker took the pool's lock (as far as it knows)
        self._lock = deps.redis.register_script(_LOCK_LUA)
        self._unlock = deps.redis.register_script(_UNLOCK_LUA)
        self._lock_name = lock_key(deps.cache.settings.key_prefix, pool)

    @property
    def settings(self) -> WarmingSettings | None:
        """This pool's warming settings now, None when warming is off for it."""
        return self.deps.cache.settings.warming_for(self.pool)

    async def run(self) -> None:
        """Step until cancelled; Redis trouble waits a tick and tries again (never raises).
        Cancelled (the app's shutdown), it gives the pool's lock back if it holds it."""
        try:
            while True:
                settings = self.settings
                if settings is None:
                    return
                try:
                    with redis_failures():
                        delay = await self.step(settings)
                except (TimeoutError, RedisUnavailable) as exc:
                    log.warning(
                        "warming %s: Redis unavailable (%s); next try in %.1f s", self.pool, _kind(exc), settings.tick_s
                    )
                    delay = settings.tick_s
                # A cancel that lands in a bounded await can be lost on Python 3.11: asyncio.timeout
                # turns it into the TimeoutError taken above for Redis trouble, wait_for returns
                # an inner result completed at the same moment. Warmer.stop's flag still ends the
                # loop (else it, and the router's shutdown, waited forever). Not the task's
                # cancelling() count: the miss path's httpx/anyio timeouts leave it raised.
                if self.stopping.is_set():
                    return
                await asyncio.sleep(delay)
        finally:
            if self.holding:  # another instance need not wait lock_ttl_s for it to expire
                with contextlib.suppress(RedisUnavailable, asyncio.TimeoutError), redis_failures():
                    await asyncio.wait_for(self.release(), _RELEASE_TIMEOUT_S)

    async def step(self, settings: WarmingSettings) -> float:
        """One look: at most one warm generation. Returns the wall seconds to wait before the next.
        The pool's lock is taken (or renewed) only when this worker can warm: an eligible
        replica, a peak slot, a key to regenerate; otherwise it is given back, so that a worker
        whose replicas are all down never keeps a healthy one from warming."""
        policy = settings.policy()
        _, capacity = pool_load(self.deps.forwarder, self.pool, time.monotonic(), settings.replica_slots)
        now = self.clock()
        plan = await self._plan(settings, policy, now) if capacity > 0 else None
        key = next((k for k in plan.keys if k not in plan.done), None) if plan is not None else None
        if key is None:
            if self.holding:
                await self.release()
            return settings.tick_s
        self.holding = bool(await self._lock(keys=[self._lock_name], args=[self.holder, settings.lock_ttl_s]))
        if not self.holding:
            self.plan = None
            return settings.tick_s
        self.tokens, self.last_refill = allowance(now, self.last_refill, self.tokens, policy)
        if self.tokens < 1:
            return min(settings.tick_s, wait_s(self.tokens, policy) / self.scale)
        busy, capacity = pool_load(self.deps.forwarder, self.pool, time.monotonic(), settings.replica_slots)
        if not idle(busy, capacity, policy):
            return settings.tick_s
        assert plan is not None
        plan.done.add(key)
        # a generation may outlast lock_ttl_s (P2's ttfb_s is 60 s): renewed while it runs, the
        # lock keeps a second worker from warming the pool at the same time
        generating = asyncio.Event()
        generating.set()
        renewal = asyncio.create_task(self._renew(settings, generating))
        try:
            sent = await self.warm(key, plan.slot[0], settings)
        finally:
            generating.clear()  # ends the renewal even if the cancel below is lost (see run)
            renewal.cancel()  # not awaited: awaiting it could swallow this task's own cancellation
        if sent is not None:
            self.tokens -= 1  # only a generation sent spends the budget (not a key without a recipe)
        return 0.0

    async def _renew(self, settings: WarmingSettings, generating: asyncio.Event) -> None:
        """Renew the pool's lock every lock_ttl_s / 3 while ``generating`` is set, until
        cancelled (never raises)."""
        while True:
            await asyncio.sleep(settings.lock_ttl_s / 3)
            if not generating.is_set():
                return
            try:
                with redis_failures():
                    held = await self._lock(keys=[self._lock_name], args=[self.holder, settings.lock_ttl_s])
            except (TimeoutError, RedisUnavailable) as exc:
                log.warning("warming %s: lock not renewed during a generation (%s)", self.pool, _kind(exc))
                continue
            if not held:
                self.holding = False
                log.warning("warming %s: lost the pool's lock during a generation", self.pool)
                return

    async def release(self) -> None:
        """Give the pool's lock back, if this worker still holds it (compare-and-delete)."""
        self.holding = False
        await self._unlock(keys=[self._lock_name], args=[self.holder])

    async def _plan(self, settings: WarmingSettings, policy: WarmPolicy, now: float) -> _Plan | None:
        """The slot to warm for and its keys, chosen again every ``tick_s`` (router clock)."""
        if self.plan is not None and now - self.plan.at < settings.tick_s * self.scale:
            return self.plan
        forecast = await self.forecast()
        slot = None if forecast is None else peak_slot(forecast.points, now, policy, forecast.capacity)
        if slot is None:
            self.plan = None
            return None
        cache = self.deps.cache
        candidates = await cache.popularity.candidates(self.pool, slot[0], settings, now, self.scale)
        done = self.plan.done if self.plan is not None and self.plan.slot == slot else set()
        self.plan = _Plan(slot, choose(candidates, slot[0], slot[1], policy), now, done)
        return self.plan

    async def forecast(self) -> Forecast | None:
        """The pool's published forecast, else the one of every pool together (``"*"``)."""
        redis = self.deps.redis
        for name in (self.pool, ALL_POOLS):
            key = FORECAST_KEY.format(pool=name)
            found, why = read_forecast(await redis.get(key))
            if why is not None and self._forecast_problems.get(key) != why:
                log.warning("warming %s: forecast %s unusable: %s; not warming on it", self.pool, key, why)
            if why is None:
                self._forecast_problems.pop(key, None)
            else:  # said once per problem, not every tick
                self._forecast_problems[key] = why
            if found is not None:
                return found
        return None

    async def warm(self, key: str, slot_start: float, settings: WarmingSettings) -> bool | None:
        """Regenerate the entry ``key`` from its recipe through the miss path: True when stored,
        False when attempted and failed, None when not attempted (no usable recipe, the pool's
        cache policy keeps the request out, or its TTL, the recipe's X-Cache-TTL or the default,
        would end before ``slot_start``)."""
        metrics = self.deps.generations
        cache = self.deps.cache
        recipe = await cache.popularity.recipe(self.pool, key, slot_start, settings)
        if recipe is None or _key_of(cache.settings, recipe) != key:
            log.info("warming %s: no usable recipe for %s", self.pool, key)
            return None
        if cachepolicy.keeps_out(self.deps.forwarder.settings.cache_policy_for(self.pool), recipe.body):
            return None  # the pool's policy changed since it was counted: not cached, so not warmed
        ttl_s = cache.ttl_for(recipe.request())  # real s; the router's clock runs scale x
        if self.clock() + ttl_s * self.scale < slot_start:
            log.info(
                "warming %s: %s would expire (TTL %d s) before its slot starts; not generated", self.pool, key, ttl_s
            )
            return None  # GPU for an entry no peak request could hit
        metrics.labels(self.pool, "attempted").inc()
        try:
            stored = await generate(self.deps.forwarder, recipe, lambda: self._recipe_kept(key, slot_start, settings))
        except APIError as exc:
            log.warning("warming %s: generation of %s failed: %s", self.pool, key, exc)
            stored = False
        metrics.labels(self.pool, "stored" if stored else "failed").inc()
        return stored

    async def _recipe_kept(self, key: str, slot_start: float, settings: WarmingSettings) -> bool:
        """True when ``key``'s recipe is still kept: DELETE /cache of its tenant or pool (which
        forgets the recipes with the entries) answered during the generation removes it."""
        if await self.deps.cache.popularity.recipe(self.pool, key, slot_start, settings) is not None:
            return True
        log.info("warming %s: %s deleted during its generation; not stored", self.pool, key)
        return False


def _key_of(settings: CacheSettings, recipe: Recipe) -> str:
    req = recipe.request()
    return exact_key(settings.key_prefix, req.endpoint, req.body, req.tenant, None, req.pool)


async def generate(
    forwarder: Forwarder, recipe: Recipe, still_wanted: Callable[[], Awaitable[bool]] | None = None
) -> bool:
    """One warm generation of ``recipe``: dispatch in its pool, the upstream call (non-stream),
    stored with ``warmed=True`` under the recipe's own request, unless ``still_wanted`` (asked
    once the answer is in) says no. True when stored; False for an answer that is not stored (a
    4xx, the replica's ``no-store``, an answer the cache refuses, no longer wanted).
    Raises APIError (no replica, a replica error, a timeout: nothing stored)."""
    creq = recipe.request()
    rec = Record(
        f"warm-{os.urandom(8).hex()}",
        time.perf_counter(),
        pool=recipe.pool,
        target=recipe.pool,
        priority=PRIORITY,
        claimed_priority=PRIORITY,
        cache="miss",
        demand=False,
    )
    rec.prompt_tokens = await forwarder.prompt_tokens.count(recipe.pool, creq.body)
    rec.size = classify.size_class(rec.prompt_tokens, forwarder.settings.size_thresholds)
    raw = json.dumps(creq.body).encode()
    upstream, lease = await forwarder.open(
        rec, _PATHS[creq.endpoint], dict(creq.body), raw, {"x-request-id": rec.request_id}
    )
    if upstream.status_code >= 400:
        await forwarder.failed(rec, upstream, lease, client_key_sent=False)  # releases the lease; a 5xx raises
        return False
    store = forwarder.answers.with_replica_control(rec, creq, upstream.headers.get("cache-control"))
    content = await forwarder.read_answer(rec, upstream, lease)  # within P2's ttfb_s
    lease.replica.health.on_success(time.monotonic())
    try:
        response = parse_json(content)
    except ValueError:
        return False
    if store is None or not isinstance(response, dict):
        return False
    if still_wanted is not None and not await still_wanted():
        return False
    return await forwarder.answers.store(rec, store, response, content, warmed=True)


class Warmer:
    """The pools' warming tasks: one per pool served here with warming on, kept in step with
    discovery (``sync`` every ``interval_s``); a task ended by a bug is logged and restarted."""

    def __init__(self, deps: WarmingDeps, clock: Any, scale: float = 1.0, interval_s: float = 1.0) -> None:
        self.deps = deps
        self.clock = clock
        self.scale = scale
        self.interval_s = interval_s
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()

    def start(self) -> None:
        """Start the supervisor: every ``interval_s`` it (re)starts a task per pool with warming on."""
        self._supervisor = asyncio.create_task(self._supervise())

    def sync(self) -> None:
        """Start a task for every pool with warming on that has none running (none once stopping)."""
        if self.stopping.is_set():
            return
        for pool in sorted(self.deps.forwarder.pools.by_model):
            task = self.tasks.get(pool)
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                log.error("warming %s stopped on an error; restarting it", pool, exc_info=task.exception())
            if (task is None or task.done()) and self.deps.cache.settings.warming_for(pool) is not None:
                warmer = PoolWarmer(self.deps, pool, self.clock, self.scale, self.stopping)
                self.tasks[pool] = asyncio.create_task(warmer.run())

    async def _supervise(self) -> None:
        while True:
            self.sync()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        """Cancel the supervisor and every pool's task, and wait for them (each gives its lock back)."""
        self.stopping.set()  # a pool's task that loses its cancel (PoolWarmer.run) still ends
        tasks = [t for t in (self._supervisor, *self.tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()


def warming_configured(settings: CacheSettings) -> bool:
    """True when some pool (or ``"*"``) has warming on and the cache (``settings``) is enabled: only
    then is a Warmer started (with the cache off, every warm answer would be refused: GPU for nothing)."""
    if not any(w.enabled for w in settings.warming.values()):
        return False
    if not settings.enabled:
        log.warning("warming: configured but the cache is disabled (PROMPTEDGE_CACHE_ENABLED=false); not warming")
        return False
    return True


__all__ = [
    "FORECAST_KEY",
    "MAX_FORECAST_BYTES",
    "Forecast",
    "PoolWarmer",
    "Warmer",
    "WarmingDeps",
    "generate",
    "parse_forecast",
    "pool_load",
    "read_forecast",
    "warming_configured",
]
