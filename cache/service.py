"""ResponseCache: the one object the router talks to (lookup, store, stats)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cache.exact import ExactStore, is_complete_response
from cache.keys import exact_key
from cache.settings import CacheSettings
from cache.stats import StatsStore
from cache.types import CacheHit, CacheRequest, Outcome

log = logging.getLogger(__name__)
T = TypeVar("T")

# After a Redis failure, requests skip the cache for this long instead of each paying the timeout.
_RETRY_AFTER_S = 1.0


class CacheUnavailable(Exception):
    """Redis did not answer within the bound, or failed; the request goes on uncached."""


class ResponseCache:
    """Exact response cache over Redis (semantic stage: issue 3).

    lookup() and store() never raise for Redis trouble: each round trip is bounded by
    ``settings.redis_timeout_s``; on failure the request is served uncached, ``healthy`` turns
    False (the router's /health reports degraded) and Redis is tried again after 1 s.
    """

    def __init__(self, redis: aioredis.Redis, settings: CacheSettings | None = None) -> None:
        self.settings = settings or CacheSettings()
        self._exact = ExactStore(redis)
        self._stats = StatsStore(redis, self.settings.key_prefix)
        self.healthy = True
        self._down_until = 0.0

    async def _bounded(self, op: Awaitable[T]) -> T:
        if time.monotonic() < self._down_until:
            if asyncio.iscoroutine(op):
                op.close()
            raise CacheUnavailable("redis marked down")
        try:
            result = await asyncio.wait_for(op, self.settings.redis_timeout_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self.healthy = False
            self._down_until = time.monotonic() + _RETRY_AFTER_S
            log.warning("cache unavailable: %s", exc.__class__.__name__)
            raise CacheUnavailable(str(exc)) from exc
        self.healthy = True
        return result

    def _key(self, req: CacheRequest) -> str:
        return exact_key(self.settings.key_prefix, req.endpoint, req.body, req.tenant)

    async def lookup(self, req: CacheRequest) -> CacheHit | None:
        """The cached response for req, or None (miss, no-cache, disabled or Redis unavailable).

        Counts the outcome per model in Redis (``no-cache`` lookups count as misses).
        """
        if not self.settings.enabled:
            return None
        hit: CacheHit | None = None
        try:
            if not req.control.no_cache:
                key = self._key(req)
                response = await self._bounded(self._exact.get(key))
                if response is not None:
                    hit = CacheHit(kind="exact", response=response, similarity=None, key=key)
            outcome: Outcome = hit.kind if hit else "miss"
            await self._bounded(self._stats.record(req.model, outcome))
        except CacheUnavailable:
            pass
        return hit

    def ttl_for(self, req: CacheRequest) -> int:
        """TTL in seconds: the per-request override clamped to the bounds, else the default."""
        s = self.settings
        if req.control.ttl_s is None:
            return s.ttl_s
        return max(s.min_ttl_s, min(s.max_ttl_s, req.control.ttl_s))

    async def store(self, req: CacheRequest, response: dict[str, Any]) -> bool:
        """Store a complete, successful response; True when it was written.

        Refuses (False) errors, partial responses, ``no-store`` requests and Redis failures.
        """
        if not self.settings.enabled or req.control.no_store or not is_complete_response(response):
            return False
        try:
            await self._bounded(self._exact.set(self._key(req), response, self.ttl_for(req)))
        except CacheUnavailable:
            return False
        return True

    async def stats(self) -> dict[str, Any]:
        """The ``/cache/stats`` JSON (see StatsStore.read); raises CacheUnavailable."""
        return await self._bounded(self._stats.read())
