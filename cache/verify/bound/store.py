"""Redis side of the per-entry error bound (cache/verify/bound/model.py): pool states, entry states
and the records of served hits that a client may report.

| key (``{prefix}`` = settings.key_prefix) | type | content | TTL |
|---|---|---|---|
| ``{prefix}:sem:entry:{<id>}`` field ``bound`` | hash field | the entry's ``EntryState`` JSON; absent: never labelled | the entry's |
| ``{prefix}:bound:pool:{<pool digest>}`` | hash | ``r<i>`` / ``w<i>``: right / wrong labels at step i of the prior | none |
| ``{prefix}:bound:hit:{<hit id>}`` | string | ``{"e": entry id, "t": tenant, "s": score}`` of one served semantic hit | feedback_ttl_s |
| ``{prefix}:bound:seen:{<pool digest>}:<pair digest>`` | string | ``1``: this (entry, query) pair has labelled the pool and the entry | the caller's (``ttl_s``) |

Every key's hash tag is its own (Redis Cluster: one slot per key, no script touches two), but a
pair's marker, which carries its pool's tag: the script that claims the marker and counts the
label in the pool (``_COUNT_ONCE``) touches one slot. The
entry's state is replaced by compare-and-set (``_ENTRY_CAS``), so two reports that race do not
lose one; an entry that is gone (deleted, expired) is never re-created. A hit record is claimed
by the tenant it was served to, once (``_CLAIM``): another tenant, or the same report twice,
finds nothing. Redis errors propagate; callers bound them.

A pool is one tenant's traffic to one model (``pool_name``): the labels one tenant's requests
produce (compared misses) move only its own pool's steps, as its entries are its own; with one
pool per model, a tenant sending greedy prompts with identical answers raised every step's
right-count and other tenants got hits for different questions (attack round, 3 December).

An operator-obtained label (shadow verification, a compared miss) counts once per (entry, query)
pair (``count_once``): greedy decoding gives the same query the same answer every time, so a
repeat is no new observation. With shadow verification on, one client sending one paraphrase 40
times made its pool's step count 40 rights (twice the shipped prior's weight) and the entry 40
(attack round, 3 December). The query is its compared text as the encoder reads it
(``query_text``: spacing and case folded, as the bundled model's tokenizer does).
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from cache.errors import BoundError
from cache.keys import digest, entry_key
from cache.verify.bound.model import BoundPrior, EntryState, PoolState, update_entry

# KEYS[1] = the entry; ARGV = the state read before ('' = none), the new state.
# Returns -1 when the entry is gone, 0 when its state changed meanwhile, 1 when written.
_ENTRY_CAS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local current = redis.call('HGET', KEYS[1], 'bound') or ''
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'bound', ARGV[2])
return 1
"""
# KEYS[1] = the hit record; ARGV[1] = the reporting tenant. The record if it is that
# tenant's (and deleted: a hit is reported once), else nil (left for its own tenant).
_CLAIM = """
local raw = redis.call('GET', KEYS[1])
if not raw then return nil end
local ok, record = pcall(cjson.decode, raw)
if not ok or type(record) ~= 'table' or record['t'] ~= ARGV[1] then return nil end
redis.call('DEL', KEYS[1])
return raw
"""
# KEYS[1] = the pool, KEYS[2] = the pair's marker (the pool's slot); ARGV = the step's field,
# the marker's TTL (s). 1 when counted, 0 when the pair has been counted already (no write).
_COUNT_ONCE = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
"""
_CAS_TRIES = 5


def query_text(text: str) -> str:
    """A query's compared text as one label's identity: runs of whitespace made one space,
    case folded (the bundled encoder lowercases and splits on whitespace, so these variants
    are the same query at the same cosine)."""
    return " ".join(text.split()).casefold()


def pool_name(tenant: str, model: str) -> str:
    """The pool whose counts ``tenant``'s lookups of ``model`` read and its labels move (see the
    module doc); unambiguous for any two strings."""
    return json.dumps([tenant, model])


class BoundStore:
    """Reads and writes bound states and hit records under ``prefix`` (see the module doc)."""

    def __init__(self, redis: aioredis.Redis, prefix: str, prior: BoundPrior) -> None:
        self._redis = redis
        self.prefix = prefix
        self.prior = prior
        self._cas = redis.register_script(_ENTRY_CAS)
        self._claim = redis.register_script(_CLAIM)
        self._count_once = redis.register_script(_COUNT_ONCE)

    def pool_key(self, pool: str) -> str:
        """The key of one pool's state (its name hashed: a name may hold braces; with a
        "region" prior, its bins too, so counts of another bin layout are never read as its)."""
        return f"{self.prefix}:bound:pool:{{{_pool_tag(pool, self.prior)}}}"

    def pair_key(self, pool: str, entry_id: str, query: str) -> str:
        """The marker of one (entry, query) pair's label in ``pool``, in the pool's slot;
        ``query`` as ``query_text`` makes it."""
        return f"{self.prefix}:bound:seen:{{{_pool_tag(pool, self.prior)}}}:{digest([pool, entry_id, query])[:32]}"

    def hit_key(self, hit_id: str) -> str:
        """The key of one served hit's record."""
        return f"{self.prefix}:bound:hit:{{{hit_id}}}"

    async def pool(self, pool: str) -> PoolState:
        """The pool's learned counts (none yet: the prior's steps as they are)."""
        raw = await self._redis.hgetall(self.pool_key(pool))
        return pool_state(raw, len(self.prior.knots))

    async def count_once(self, pool: str, score: float, right: bool, entry_id: str, query: str, ttl_s: int) -> bool:
        """Count one operator-obtained label (shadow verification, a compared miss) of entry
        ``entry_id`` for ``query`` (``query_text``) in the pool, unless that pair has been
        counted in the last ``ttl_s`` seconds (one script, one round trip). True when counted:
        only then may the entry learn it too (``report``)."""
        field = f"{'r' if right else 'w'}{self.prior.step(score)}"
        keys = [self.pool_key(pool), self.pair_key(pool, entry_id, query)]
        return bool(await self._count_once(keys=keys, args=[field, ttl_s]))

    async def remember_hit(self, hit_id: str, entry_id: str, tenant: str, score: float, ttl_s: int) -> None:
        """Record a served semantic hit that its tenant may report within ``ttl_s``."""
        record = json.dumps({"e": entry_id, "t": tenant, "s": round(score, 6)}, separators=(",", ":"))
        await self._redis.set(self.hit_key(hit_id), record, ex=ttl_s)

    async def claim_hit(self, hit_id: str, tenant: str) -> tuple[str, float] | None:
        """(entry id, score) of a hit served to ``tenant`` and not reported yet; the record is
        deleted. None for an unknown, expired, already reported or another tenant's hit."""
        raw = await self._claim(keys=[self.hit_key(hit_id)], args=[tenant])
        if raw is None:
            return None
        record = json.loads(raw)
        return str(record["e"]), float(record["s"])

    async def report(self, entry_id: str, pool: str, score: float, right: bool) -> EntryState | None:
        """Update the entry's state with one label (``update_entry``) by compare-and-set;
        the new state, or None when the entry is gone or kept changing under us."""
        key = entry_key(self.prefix, entry_id)
        pool_state_now = await self.pool(pool)
        for _ in range(_CAS_TRIES):
            raw = await self._redis.hget(key, "bound")
            before = "" if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)
            state = entry_state(before, self.prior)
            after = update_entry(self.prior, score, right, state, pool_state_now)
            written = await self._cas(keys=[key], args=[before, json.dumps(after.to_json(), separators=(",", ":"))])
            if written == -1:
                return None
            if written == 1:
                return after
        return None


def _pool_tag(pool: str, prior: BoundPrior) -> str:
    if prior.mode == "steps":
        return digest([pool])[:16]  # as before the region mode: existing pools keep their counts
    return digest([pool, prior.mode, list(prior.knots)])[:16]


def entry_state(raw: str | bytes | None, prior: BoundPrior) -> EntryState:
    """An entry's stored state; a new entry's when absent or unreadable."""
    if not raw:
        return prior.new_entry()
    try:
        return EntryState.from_json(json.loads(raw))
    except (ValueError, BoundError):
        return prior.new_entry()


def pool_state(raw: dict[Any, Any], steps: int) -> PoolState:
    """A pool's state from its hash (fields ``r<i>`` / ``w<i>``; others ignored)."""
    right, wrong = [0] * steps, [0] * steps
    for field, value in raw.items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        try:
            i, n = int(name[1:]), int(value)
        except ValueError:
            continue
        if 0 <= i < steps and n > 0:
            (right if name[:1] == "r" else wrong if name[:1] == "w" else [0] * steps)[i] = n
    return PoolState(tuple(right), tuple(wrong))
