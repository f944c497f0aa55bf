"""Popularity of exact-cache keys per time-of-day slot, and the recipes to regenerate them (Redis).

Written only for pools with warming enabled (``CacheSettings.warming_for``), by the cache itself:
an exact hit and a stored miss each count their request once (``record``); nothing else does, so
a request the cache would not store (an error, a partial answer, ``no-store``, a pool policy that
keeps it out) is never counted, and neither is a semantic hit (its own request has no entry to
regenerate) nor a warm generation (the warmer must not feed its own counts).

Layout, per pool (``pool_tag``: 16 hex digits of SHA-256 of the pool's name, the Redis Cluster
hash tag, so a script touches one slot and pools spread over the nodes):

- ``{prefix}:warm:count:{<pool tag>}:{day}:{slot}``: sorted set, exact key -> requests in that UTC
  day (days since the epoch) and slot of the day; at most ``keep_per_slot`` members;
- ``{prefix}:warm:recipe:{<pool tag>}:{day}:{slot}``: hash, exact key -> recipe JSON (below), for
  the members of that sorted set only (a trimmed member's recipe is deleted with it);
- ``{prefix}:warm:order:{<pool tag>}:{day}:{slot}``: sorted set (scores 0) of
  ``<tenant tag>:<count, 12 digits>:<exact key>``, each tenant's members by count;
- ``{prefix}:warm:tenants:{<pool tag>}:{day}:{slot}``: sorted set, tenant tag -> members it holds;
- ``{prefix}:warm:group:{<pool tag>}:{day}:{slot}``: hash, exact key -> its tenant tag;
- all expire ``history_days + 1`` days after their last write: the retention of the prompts.

A member's tenant tag (its fairness group) is 16 hex digits of SHA-256 of the request's tenant
*label* (``CacheRequest.label``): a mapped tenant's name, ``default`` for requests without a
key, and ``other`` for every API key without a mapping. Those keys are cache tenants of their
own (each its own scope), but a client can make as many of them as it likes: as groups of their
own, 100 throwaway keys sending one prompt each pushed a tenant's hot prompts out of the slot
and took the warming budget. Members recorded before the group hash existed fall back to their
exact key's scope tag. Fairness:
over ``keep_per_slot`` members, the lowest-count members **of the tenant holding the most** are
trimmed (members counted before the order index existed go first, lowest counts), so a tenant
is trimmed only while no tenant holds more (each keeps about ``keep_per_slot`` / tenants of the
slot, or all of its own); and ``candidates`` takes the ``top_k`` round-robin over
tenants by rank (plan.py ``fair_top``), so one tenant gets at most its share while others have
candidates.

A recipe is what regenerating the entry needs, nothing more: endpoint, tenant (the cache scope),
tenant label (statistics), pool, the client's own request body (of the first request counted in
that slot) minus the fields the exact key ignores (``NEUTRAL_FIELDS``: ``stream``,
``stream_options``, ``user``, ``metadata``, ...; ``recipe_body``), whether the semantic stage
applied, and the TTL override. Explicit defaults and ``max_completion_tokens`` stay as sent: a
warm generation is the clients' request, not its canonical form. Its exact key must come out of
it again (checked when it is recorded), so a regenerated answer lands under the key the
clients' requests look up, in the same scope. A body surely over ``max_recipe_bytes`` is refused
before the recipe is built.

Warmed entries carry a side key ``{prefix}:warm:mark:{<scope tag>}:{sha}`` (the entry's own slot,
same TTL), so hits on them can be counted apart.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from cache.keys import NEUTRAL_FIELDS, digest, exact_key
from cache.types import CacheControl, CacheRequest, Endpoint
from cache.warming.plan import WarmCandidate, earlier_days, fair_top, slot_of
from cache.warming.settings import WarmingSettings

# Shared by both scripts. KEYS[1] counts (zset), KEYS[2] recipes (hash), KEYS[3] order (zset of
# "<tenant tag>:<count, 12 digits>:<member>", all scores 0: each tenant's members by count, read
# by ZRANGEBYLEX), KEYS[4] tenants (zset, tenant tag -> members it holds), KEYS[5] groups (hash,
# member -> tenant tag); one (pool, day, slot), one cluster slot. A member without a group entry
# (recorded before it existed) has its exact key's scope tag ("{...}" before the sha).
_HELPERS = """
local function tag_of(m) return string.match(m, '{([^{}]*)}:[^:]*$') or '' end
local function group_of(m) return redis.call('HGET', KEYS[5], m) or tag_of(m) end
local function entry(t, m, score) return t .. ':' .. string.format('%012d', tonumber(score)) .. ':' .. m end
local function unentry(t, e)  -- removes order entry e of tenant t, lowering t's share
  if redis.call('ZREM', KEYS[3], e) == 0 then return end
  if tonumber(redis.call('ZINCRBY', KEYS[4], -1, t)) <= 0 then redis.call('ZREM', KEYS[4], t) end
end
local function drop(m)  -- m's count, order entry, group and recipe; 1 when its recipe was there
  local score = redis.call('ZSCORE', KEYS[1], m)
  if score then
    redis.call('ZREM', KEYS[1], m)
    local t = group_of(m)
    unentry(t, entry(t, m, score))
  end
  redis.call('HDEL', KEYS[5], m)
  return redis.call('HDEL', KEYS[2], m)
end
"""

# ARGV: member, recipe, ttl s, keep, tenant tag. Counts the member; over ``keep`` members, trims
# the lowest-count members of the tenant holding the most (module doc), members counted before
# the order index existed (no entry) first by lowest count. A member keeps the tenant tag it was
# first counted with.
_RECORD_LUA = (
    _HELPERS
    + """
local m = ARGV[1]
local fresh = redis.call('EXISTS', KEYS[2]) == 0  -- this (pool, day, slot)'s first recipe
local old = redis.call('ZSCORE', KEYS[1], m)
local new = redis.call('ZINCRBY', KEYS[1], 1, m)
local t = ARGV[5]
if old then t = group_of(m) else redis.call('HSET', KEYS[5], m, t) end
if not old or redis.call('ZREM', KEYS[3], entry(t, m, old)) == 0 then
  redis.call('ZINCRBY', KEYS[4], 1, t)  -- a member new to the order index
end
redis.call('ZADD', KEYS[3], 0, entry(t, m, new))
redis.call('HSETNX', KEYS[2], m, ARGV[2])
for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
local unindexed = redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[3])
while extra > 0 do
  local gone = {}
  if unindexed > 0 then  -- older members: the lowest counts, as before the index
    gone = redis.call('ZRANGE', KEYS[1], 0, math.min(extra, unindexed, 1000) - 1)
    unindexed = unindexed - #gone
  else
    local top = redis.call('ZREVRANGE', KEYS[4], 0, 1, 'WITHSCORES')
    if #top == 0 then break end
    local t = top[1]
    local n = math.min(extra, 1000)
    if #top == 4 then n = math.min(n, math.max(1, tonumber(top[2]) - tonumber(top[4]))) end
    local low = redis.call('ZRANGEBYLEX', KEYS[3], '[' .. t .. ':', '(' .. t .. ';', 'LIMIT', 0, n)
    if #low == 0 then redis.call('ZREM', KEYS[4], t) end  -- a share with no entries left
    for _, e in ipairs(low) do
      local g = string.sub(e, #t + 15)
      if redis.call('ZSCORE', KEYS[1], g) then gone[#gone + 1] = g else unentry(t, e) end  -- stale entry
    end
  end
  for _, g in ipairs(gone) do drop(g) end
  extra = extra - #gone
end
if fresh then return 2 end
return 1
"""
)

# ARGV: members to forget (at most _FORGET_CHUNK per call). Returns the recipes deleted (HSCAN
# may hand the caller a member twice).
_FORGET_LUA = (
    _HELPERS
    + """
local deleted = 0
for i = 1, #ARGV do deleted = deleted + drop(ARGV[i]) end
return deleted
"""
)
_FORGET_CHUNK = 1000  # members per HSCAN page and per script call: no call grows with the slot


def pool_tag(pool: str) -> str:
    """Hash tag of one pool's warming keys: 16 hex digits of SHA-256 of its name (pure)."""
    return digest(["warm", pool])[:16]


def count_key(prefix: str, pool: str, day: int, slot: int) -> str:
    """The sorted set of one pool's (day, slot) counts."""
    return f"{prefix}:warm:count:{{{pool_tag(pool)}}}:{day}:{slot}"


def recipe_key(prefix: str, pool: str, day: int, slot: int) -> str:
    """The hash of the recipes of that sorted set's members."""
    return f"{prefix}:warm:recipe:{{{pool_tag(pool)}}}:{day}:{slot}"


def order_key(prefix: str, pool: str, day: int, slot: int) -> str:
    """The index of that sorted set's members by tenant, then count (lexicographic, for trimming)."""
    return f"{prefix}:warm:order:{{{pool_tag(pool)}}}:{day}:{slot}"


def tenants_key(prefix: str, pool: str, day: int, slot: int) -> str:
    """The sorted set of that sorted set's tenants (scope tags) -> members each holds."""
    return f"{prefix}:warm:tenants:{{{pool_tag(pool)}}}:{day}:{slot}"


def group_key(prefix: str, pool: str, day: int, slot: int) -> str:
    """The hash of that sorted set's members -> their tenant tags (fairness groups)."""
    return f"{prefix}:warm:group:{{{pool_tag(pool)}}}:{day}:{slot}"


def group_tag(label: str) -> str:
    """The tenant tag (fairness group) of a tenant label: 16 hex digits of SHA-256 (pure)."""
    return digest(["warm-group", label])[:16]


def slots_key(prefix: str) -> str:
    """The set of every recipe hash's name (all pools, days and slots), added to when a hash is
    created, so a deletion reads the hashes from it instead of walking the keyspace."""
    return f"{prefix}:warm:slots"


def slot_keys(prefix: str, pool: str, day: int, slot: int) -> list[str]:
    """The keys one (pool, day, slot)'s scripts touch, in their KEYS order (one cluster slot)."""
    return [
        count_key(prefix, pool, day, slot),
        recipe_key(prefix, pool, day, slot),
        order_key(prefix, pool, day, slot),
        tenants_key(prefix, pool, day, slot),
        group_key(prefix, pool, day, slot),
    ]


_TAG = re.compile(r"\{([^{}]*)\}:[^:]*$")


def group_of(key: str) -> str:
    """The scope tag of an exact key (tenant and pool), "" for another string: the tenant tag of
    a member recorded before the group hash existed."""
    found = _TAG.search(key)
    return found.group(1) if found else ""


def lock_key(prefix: str, pool: str) -> str:
    """The key one router worker holds while it warms ``pool`` (SET NX EX)."""
    return f"{prefix}:warm:lock:{{{pool_tag(pool)}}}"


def mark_key(prefix: str, key: str) -> str:
    """The side key marking the exact entry ``key`` as warmed (same hash tag as the entry)."""
    head = f"{prefix}:exact:"
    if not key.startswith(head):
        raise ValueError(f"not an exact-cache key of prefix {prefix!r}: {key!r}")
    return f"{prefix}:warm:mark:{key[len(head) :]}"


@dataclass(frozen=True)
class Recipe:
    """What regenerating one exact entry needs (module doc). ``key`` is its exact key."""

    key: str
    endpoint: Endpoint
    tenant: str
    tenant_label: str | None
    pool: str
    body: dict[str, Any]
    semantic: bool
    ttl_s: int | None

    def request(self) -> CacheRequest:
        """The CacheRequest a warm generation is stored under (same key and scope)."""
        return CacheRequest(
            self.endpoint,
            self.body,
            self.tenant,
            CacheControl(semantic=self.semantic, ttl_s=self.ttl_s),
            self.pool,
            self.tenant_label,
        )

    def to_json(self) -> str:
        """The recipe as compact JSON with sorted keys (what the recipe hash stores; ``from_json``
        reads it back)."""
        return json.dumps(
            {
                "key": self.key,
                "endpoint": self.endpoint,
                "tenant": self.tenant,
                "tenant_label": self.tenant_label,
                "pool": self.pool,
                "body": self.body,
                "semantic": self.semantic,
                "ttl_s": self.ttl_s,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Recipe:
        """Raises ValueError (also KeyError, TypeError as ValueError) on a malformed recipe."""
        try:
            d = json.loads(raw)
            return cls(
                str(d["key"]),
                d["endpoint"],
                str(d["tenant"]),
                d["tenant_label"],
                str(d["pool"]),
                dict(d["body"]),
                bool(d["semantic"]),
                d["ttl_s"],
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed warming recipe: {exc}") from None


def recipe_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body a warm generation sends (pure): the client's own, minus the fields the exact key
    ignores (cache/keys.py ``NEUTRAL_FIELDS``: ``stream`` and ``stream_options``, the end user's
    ids, ``metadata``, ``store``, the per-request ``request_id`` and ``priority``), which by that
    rule cannot change the answer and are not the warmer's to send. Everything else is kept as
    the client sent it: an explicit default (``temperature: 1.0``) is not the same request to an
    upstream that fills missing fields from the model's generation config, and
    ``max_completion_tokens`` is not renamed."""
    return {name: value for name, value in body.items() if name not in NEUTRAL_FIELDS}


def surely_larger(value: Any, limit: int) -> bool:
    """True when ``value``'s JSON is surely longer than ``limit`` bytes (pure): its strings'
    lengths plus one per item are a lower bound of it, summed until past ``limit``, so an 8 MB
    body costs O(limit), not a serialisation, before it is refused."""
    size = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, Mapping):
            size += 2 + 4 * len(item)  # braces; quotes, colon and comma of each field
            if size > limit:
                return True
            size += sum(len(name) for name in item if isinstance(name, str))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += 1 + len(item)  # brackets and commas
            if size > limit:
                return True
            stack.extend(item)
        else:
            size += 1
        if size > limit:
            return True
    return False


def recipe_for(prefix: str, req: CacheRequest, key: str) -> Recipe | None:
    """The recipe of ``req`` (whose exact key is ``key``), or None when its body would not
    give ``key`` back (then regenerating it could never serve the requests it was counted for)."""
    body = recipe_body(req.body)
    if exact_key(prefix, req.endpoint, body, req.tenant, None, req.pool) != key:
        return None
    return Recipe(
        key, req.endpoint, req.tenant, req.tenant_label, req.model, body, req.control.semantic, req.control.ttl_s
    )


class Popularity:
    """Counts and recipes in Redis (module doc). Redis errors propagate: the caller bounds and
    absorbs them (ResponseCache, the router's warmer)."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix
        self._record = redis.register_script(_RECORD_LUA)
        self._forget = redis.register_script(_FORGET_LUA)

    async def record(self, req: CacheRequest, key: str, settings: WarmingSettings, now_s: float) -> bool:
        """Count ``req`` (exact key ``key``) in its pool's slot of ``now_s`` (Unix s) and keep its
        recipe. False when not counted: the recipe's JSON is over ``max_recipe_bytes`` or the
        request does not rebuild to its key."""
        if surely_larger(req.body, settings.max_recipe_bytes):  # before building the recipe
            return False
        recipe = recipe_for(self._prefix, req, key)
        if recipe is None:
            return False
        text = recipe.to_json()
        if len(text.encode()) > settings.max_recipe_bytes:
            return False
        day, slot = slot_of(now_s, settings.slot_s)
        keys = slot_keys(self._prefix, req.model, day, slot)
        created = await self._record(
            keys=keys, args=[key, text, settings.history_ttl_s, settings.keep_per_slot, group_tag(req.label)]
        )
        if int(created) == 2:  # a new recipe hash: list it for deletions (its own key: another cluster slot)
            pipe = self._redis.pipeline(transaction=False)
            pipe.sadd(slots_key(self._prefix), keys[1])
            pipe.expire(slots_key(self._prefix), settings.history_ttl_s)
            await pipe.execute()
        return True

    async def candidates(
        self, pool: str, slot_start_s: float, settings: WarmingSettings, now_s: float, ttl_scale: float = 1.0
    ) -> list[WarmCandidate]:
        """The ``top_k`` keys of the slot at ``slot_start_s`` summed over the ``history_days`` days
        before it, taken round-robin over tenants by rank (plan.py ``fair_top``), each with the days it was seen and when its entry expires:
        ``now_s`` + its remaining TTL x ``ttl_scale`` (Redis TTLs are wall seconds; the
        router's clock may run faster), None when there is no entry, inf when it never expires."""
        policy = settings.policy()
        pipe = self._redis.pipeline(transaction=False)
        for day, slot in earlier_days(slot_start_s, policy):
            pipe.zrevrange(count_key(self._prefix, pool, day, slot), 0, settings.keep_per_slot - 1, withscores=True)
            pipe.hgetall(group_key(self._prefix, pool, day, slot))
        counts: dict[str, float] = {}
        days: dict[str, int] = {}
        groups: dict[str, str] = {}
        replies = await pipe.execute()
        for members, tags in zip(replies[::2], replies[1::2], strict=True):
            for member, score in members:
                name = member.decode() if isinstance(member, bytes) else member
                counts[name] = counts.get(name, 0.0) + float(score)
                days[name] = days.get(name, 0) + 1
            for member, tag in tags.items():
                name = member.decode() if isinstance(member, bytes) else member
                groups.setdefault(name, tag.decode() if isinstance(tag, bytes) else tag)
        ranked = [WarmCandidate(k, counts[k], days[k], None, groups.get(k) or group_of(k)) for k in counts]
        top = [c.key for c in fair_top(ranked, policy.top_k)]  # round-robin over tenants by rank
        if not top:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for key in top:
            pipe.pttl(key)
        ttls = await pipe.execute()
        out = []
        for key, pttl in zip(top, ttls):
            until = None if pttl == -2 else math.inf if pttl == -1 else now_s + pttl / 1000 * ttl_scale
            out.append(WarmCandidate(key, counts[key], days[key], until, groups.get(key) or group_of(key)))
        return out

    async def recipe(self, pool: str, key: str, slot_start_s: float, settings: WarmingSettings) -> Recipe | None:
        """The most recent recipe of ``key`` among the earlier days' slots, or None (trimmed,
        expired or malformed)."""
        pipe = self._redis.pipeline(transaction=False)
        for day, slot in earlier_days(slot_start_s, settings.policy()):  # most recent day first
            pipe.hget(recipe_key(self._prefix, pool, day, slot), key)
        for raw in await pipe.execute():
            if raw is None:
                continue
            try:
                recipe = Recipe.from_json(raw)
            except ValueError:
                continue
            if recipe.key == key and recipe.pool == pool:
                return recipe
        return None

    async def mark(self, key: str, ttl_s: int) -> None:
        """Mark the exact entry ``key`` as warmed for ``ttl_s`` s (its own TTL)."""
        await self._redis.set(mark_key(self._prefix, key), b"1", ex=ttl_s)

    async def unmark(self, key: str) -> None:
        """The entry ``key`` was stored again by a client's miss: no longer a warmed one."""
        await self._redis.delete(mark_key(self._prefix, key))

    async def marked(self, key: str) -> bool:
        """True when the exact entry ``key`` was written by the warmer (and not since by a client)."""
        return bool(await self._redis.exists(mark_key(self._prefix, key)))

    async def forget(self, tenant: str | None, pool: str | None) -> int:
        """Delete the counts and recipes of a tenant and/or pool (None: any), with the cache's
        entries (``ResponseCache.delete``): the prompts kept for warming go with them. SCAN of
        recipe hash listed in ``slots_key`` (a cache that never warmed has none: one SMEMBERS);
        names whose hash has expired leave the list. Returns recipes deleted."""
        head = f"{self._prefix}:warm:recipe:"
        deleted = 0
        listed = await self._redis.smembers(slots_key(self._prefix))
        for name in sorted(n.decode() if isinstance(n, bytes) else n for n in listed):
            rest = name[len(head) :]
            keys = [f"{self._prefix}:warm:{kind}:{rest}" for kind in ("count", "recipe", "order", "tenants", "group")]
            doomed: list[Any] = []
            # HSCAN, not HGETALL: a slot may hold keep_per_slot (up to 100,000) recipes
            async for member, raw in self._redis.hscan_iter(name, count=_FORGET_CHUNK):
                try:
                    recipe = Recipe.from_json(raw)
                except ValueError:
                    doomed.append(member)
                    continue
                if (tenant is None or recipe.tenant == tenant) and (pool is None or recipe.pool == pool):
                    doomed.append(member)
                if len(doomed) >= _FORGET_CHUNK:
                    deleted += int(await self._forget(keys=keys, args=doomed))
                    doomed = []
            if doomed:
                deleted += int(await self._forget(keys=keys, args=doomed))
            if not await self._redis.exists(name):  # expired, or emptied just now
                await self._redis.srem(slots_key(self._prefix), name)
        return deleted
