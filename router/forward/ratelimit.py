"""Per-API-key token buckets in Redis (requests per second and tokens per minute).

One Lua script checks and takes from both buckets of a key atomically, in one round trip,
with Redis's clock (so several router processes share the buckets). A bucket refills
continuously at its rate up to its capacity. API keys are stored hashed. If Redis does not
answer, requests are admitted (fail open: an outage of the limiter must not become an outage
of the service) and Redis is skipped for 1 s; ``unavailable`` counts those admissions.
Keys without a mapping and without their own limit share one group of ``"*"`` buckets.

Redis keys: ``promptedge:ratelimit:{<owner hash>}:requests`` and ``...:tokens`` (hashes
``tokens``, ``ts``; expire when full again). The script reads and writes both buckets of an owner
at once, so both carry the owner's hash as their Redis Cluster hash tag (one slot); different
owners spread over the nodes.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Collection, Mapping

import redis.asyncio as aioredis

from router.errors import RedisUnavailable
from router.redis_errors import redis_failures
from router.settings import RateLimit

log = logging.getLogger("router.ratelimit")

_BUCKETS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local wait = 0
local level = {}
for i = 1, #KEYS do
  local rate, cap, cost = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local b = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(b[1]) or cap
  local ts = tonumber(b[2]) or now
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  if tokens < cost then wait = math.max(wait, (cost - tokens) / rate) end
  level[i] = tokens
end
for i = 1, #KEYS do
  local rate, cap, cost = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local left = level[i]
  if wait == 0 then left = left - cost end
  redis.call('HSET', KEYS[i], 'tokens', tostring(left), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil(cap / rate * 1000) + 1000)
end
return tostring(wait)
"""
_SETTLE = """
local b = redis.call('HGET', KEYS[1], 'tokens')
if not b then return 0 end
local cap = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'tokens', tostring(math.max(-cap, math.min(cap, tonumber(b) + tonumber(ARGV[1])))))
return 1
"""
_RETRY_AFTER_S = 1.0


ANY_KEY = "*"


def bucket_owner(api_key: str, limits: Mapping[str, RateLimit], known: Collection[str]) -> tuple[str, RateLimit | None]:
    """Whose buckets a request draws from, and their limit (pure).

    A key with its own entry in ``limits``, or a key in ``known`` (the mapped keys of
    ``API_KEYS``), has buckets of its own (a known key without an entry gets the ``"*"`` limit);
    every other key, and no key, is one group sharing the ``"*"`` buckets, so a client cannot
    escape the limit by sending a fresh random key per request. Returns (bucket name, limit);
    the bucket name is the key itself or ``"*"``, and is hashed before it reaches Redis."""
    if api_key in limits and api_key != ANY_KEY:
        return api_key, limits[api_key]
    if api_key and api_key in known:
        return api_key, limits.get(ANY_KEY)
    return ANY_KEY, limits.get(ANY_KEY)


class RateLimiter:
    """Token buckets per API key (:func:`bucket_owner`): keys listed in ``limits`` or mapped in
    ``known`` each have their own; all other keys and requests without a key share ``"*"``'s."""

    def __init__(self, redis: aioredis.Redis, limits: dict[str, RateLimit], known: Collection[str] = ()) -> None:
        self.redis = redis
        self.limits = limits
        self.known = frozenset(known)
        self.unavailable = 0
        self._script = redis.register_script(_BUCKETS)
        self._settle = redis.register_script(_SETTLE)
        self._down_until = 0.0

    def _owner(self, api_key: str) -> tuple[str, RateLimit | None]:
        owner, limit = bucket_owner(api_key, self.limits, self.known)
        # "*" is hashed like a key, so the shared buckets' names look like any other's; the hash
        # is the hash tag: an owner's two buckets, which one script updates, share a slot
        return f"promptedge:ratelimit:{{{hashlib.sha256(owner.encode()).hexdigest()[:24]}}}", limit

    async def settle(self, api_key: str, charged: int, used: int) -> None:
        """Correct the key's tokens bucket once the answer's real usage is known: it was
        charged ``charged`` tokens (prompt count + output bound) at admission and used ``used``
        (the replica's prompt + completion tokens), so the difference goes back (or, for an
        under-estimate, is taken; the level stays within -capacity..capacity). Never raises."""
        key, limit = self._owner(api_key)
        if limit is None or limit.tokens_per_min is None or time.monotonic() < self._down_until:
            return
        delta = min(charged, limit.tokens_per_min) - used
        if delta == 0:
            return
        try:
            with redis_failures():
                await self._settle(keys=[f"{key}:tokens"], args=[delta, limit.tokens_per_min])
        except RedisUnavailable as exc:
            log.warning("rate limiter unavailable, usage not settled: %s: %s", exc.kind, exc)

    async def admit(self, api_key: str, tokens: int) -> tuple[float, int]:
        """Take this request's cost from its key's buckets if it fits. Returns (seconds until it
        would fit, 0) when it does not, else (0.0, tokens taken from the tokens bucket): what a
        later :meth:`settle` may correct. Nothing is taken, (0.0, 0), when the key has no
        limit, no tokens bucket, or Redis fails (admitted: fail open), so a settle never gives
        back what was not taken.

        tokens: the request's token cost (prompt estimate + max_tokens). A cost larger than a
        bucket's capacity can never fit: it is charged the full capacity instead.
        """
        name, limit = self._owner(api_key)
        if limit is None or time.monotonic() < self._down_until:
            return 0.0, 0
        keys, args = [], []
        if limit.requests_per_s is not None:
            keys.append(f"{name}:requests")
            args += [limit.requests_per_s, limit.burst or max(1, math.ceil(limit.requests_per_s)), 1]
        if limit.tokens_per_min is not None:
            keys.append(f"{name}:tokens")
            args += [limit.tokens_per_min / 60.0, limit.tokens_per_min, min(tokens, limit.tokens_per_min)]
        if not keys:
            return 0.0, 0
        try:
            with redis_failures():
                wait = float(await self._script(keys=keys, args=args))
        except RedisUnavailable as exc:
            self.unavailable += 1
            self._down_until = time.monotonic() + _RETRY_AFTER_S
            log.warning("rate limiter unavailable, admitting: %s: %s", exc.kind, exc)
            return 0.0, 0
        if wait > 0 or limit.tokens_per_min is None:
            return wait, 0
        return 0.0, min(tokens, limit.tokens_per_min)
