"""Redis side of the semantic cache: entries, the expiry-ordered set and the change stream.

Redis is the source of truth; the in-process ScopedIndex of every router worker is a derived
copy, rebuilt from here at start and kept in sync by following one Redis Stream of inserts and
deletes.

Key layout (``{prefix}`` = settings.key_prefix, default ``promptedge:cache``):

| key | type | content | TTL |
|---|---|---|---|
| ``{prefix}:sem:entry:{<id>}`` | hash | ``response`` (JSON), ``embedding`` (base64 of float32 bytes, so clients with or without decode_responses read it), ``scope``, ``text`` (last user turn), ``tenant``, ``model``, ``created_at``, ``expires_at`` (Unix s), ``prompt_tokens``, ``completion_tokens``; ``bound`` once labelled (cache/verify/bound/store.py) | fixed, = entry TTL |
| ``{prefix}:{sem}:expiry`` | sorted set | entry id scored by ``expires_at`` (eviction order, rebuild, delete-by) | none |
| ``{prefix}:{sem}:group:{label}`` | sorted set | the ids of one tenant group (the tenant's statistics label: a mapped tenant, ``default``, ``other`` for every unmapped key) scored by ``expires_at`` (fair eviction) | none |
| ``{prefix}:{sem}:groups`` | set | the labels that have a ``group:`` set | none |
| ``{prefix}:{sem}:events`` | stream | ``op`` = ``add`` (``id``, ``scope``, ``exp``, ``vec``, ``origin``) or ``del`` (``id``, ``origin``); trimmed to about ``stream_maxlen`` | none |

Eviction (fair between tenants): when more than ``max_entries`` ids are live, the victim is the
soonest-expiring entry of the *group holding the most live entries* (ties: the smaller label),
repeated until the bound holds, in one Lua script. A group over its fair share pays first, so
neither a tenant's volume nor its ``X-Cache-TTL`` can push another tenant's entries out; a
TTL only orders eviction within its own group. Groups are statistics labels, a bounded set, so
sending random API keys (each an isolation tenant of its own) does not make new groups. A
``del`` event is published for every victim, so all workers drop the same entries.

Redis Cluster hash tags (the text inside a key's first ``{...}`` picks its slot): the index's
bookkeeping (expiry, groups, group sets, the stream) is read and written together by one Lua
script per insert or delete and holds the global view fair eviction needs, so it shares the tag
``{sem}``: one slot. Each entry's tag is its own id: no script or transaction touches an entry
together with another key (it is written by a one-key script before its ``add`` event, deleted
before its ``del`` event), so the entries, nearly all the bytes, spread over every node. Two
caches with different prefixes on one cluster share the ``{sem}`` slot, never a key.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from cache.errors import CorruptEntry
from cache.keys import entry_key

# The index side of an insert, then eviction, in one script (one slot: the ``{sem}`` tag).
# KEYS = expiry, groups, the entry's group set, events; ARGV = now, max_entries, group key
# prefix, id, expires_at, label, stream maxlen, then the ``add`` event's field/value pairs.
# Returns the victims (already removed from expiry and their group; the caller deletes their
# entries and publishes their ``del``). It names group keys it builds itself: legal in Redis
# Cluster too, because every group key carries the same ``{sem}`` tag, so the same slot.
_INDEX_ADD = """
local now, limit, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], ARGV[5], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[6])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', unpack(ARGV, 8))
local over = redis.call('ZCARD', KEYS[1]) - limit
local victims = {}
if over <= 0 then return victims end
local sizes = {}
for _, g in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('ZREMRANGEBYSCORE', prefix .. g, '-inf', now)
  local n = redis.call('ZCARD', prefix .. g)
  if n == 0 then redis.call('SREM', KEYS[2], g) else sizes[g] = n end
end
while over > 0 do
  local best, most = nil, 0
  for g, n in pairs(sizes) do
    if n > most or (n == most and g < best) then best, most = g, n end
  end
  if best == nil then break end
  local popped = redis.call('ZPOPMIN', prefix .. best)
  sizes[best] = most - 1
  if popped[1] ~= nil then
    table.insert(victims, popped[1])
    redis.call('ZREM', KEYS[1], popped[1])
  end
  over = over - 1
end
if over > 0 then
  -- entries without a group (written before groups existed): soonest-expiring first
  local rest = redis.call('ZPOPMIN', KEYS[1], over)
  for i = 1, #rest, 2 do table.insert(victims, rest[i]) end
end
return victims
"""
# The index side of a delete (one slot, ``{sem}``): KEYS = expiry, groups, events; ARGV = group
# key prefix, stream maxlen, origin, then the ids.
_INDEX_DEL = """
local prefix, maxlen, origin = ARGV[1], ARGV[2], ARGV[3]
local ids = {unpack(ARGV, 4)}
redis.call('ZREM', KEYS[1], unpack(ids))
for _, g in ipairs(redis.call('SMEMBERS', KEYS[2])) do redis.call('ZREM', prefix .. g, unpack(ids)) end
for _, id in ipairs(ids) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 'op', 'del', 'id', id, 'origin', origin)
end
"""
# One entry, replaced whole with a fixed expiry (one key: the entry's own slot).
# KEYS[1] = the entry; ARGV = expiry (Unix ms), then field/value pairs.
_ENTRY_SET = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
"""
_CHUNK = 500  # ids per script call or pipeline

_ENTRY_FIELDS = (
    "response",
    "embedding",
    "scope",
    "text",
    "tenant",
    "model",
    "expires_at",
    "prompt_tokens",
    "completion_tokens",
    "bound",
)


def _pairs(mapping: dict[str, Any]) -> list[Any]:
    """{field: value} -> [field, value, ...], as HSET and XADD take them in a script."""
    return [item for pair in mapping.items() for item in pair]


@dataclass(frozen=True)
class StoredEntry:
    """One decoded semantic entry (see the module's key layout)."""

    entry_id: str
    scope: str
    text: str
    tenant: str
    model: str
    response: dict[str, Any]
    embedding: np.ndarray
    expires_at: float
    prompt_tokens: int
    completion_tokens: int
    bound: str = ""  # the per-entry error bound's state (cache/verify/bound/store.py), "" = never labelled


@dataclass(frozen=True)
class IndexEvent:
    """A change read from the stream: op "add" carries scope, vector and expiry; "del" only the id."""

    stream_id: str
    op: str
    entry_id: str
    origin: str
    scope: str = ""
    vector: np.ndarray | None = None
    expires_at: float = 0.0


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _vector(value: bytes | str | None) -> np.ndarray:
    return np.frombuffer(base64.b64decode(_s(value), validate=True), dtype=np.float32)


def encode_vector(vector: np.ndarray) -> str:
    """float32 vector -> base64 text as stored in entries and events."""
    return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()


def decode_entry(entry_id: str, raw: Sequence[bytes | None], dim: int) -> StoredEntry | None:
    """Decode HMGET values in ``_ENTRY_FIELDS`` order; None when the key is gone; raises
    CorruptEntry when present but malformed."""
    if all(value is None for value in raw):
        return None
    values = dict(zip(_ENTRY_FIELDS, raw, strict=True))
    try:
        response = json.loads(_s(values["response"]))
        vector = _vector(values["embedding"])
        if not isinstance(response, dict) or vector.shape != (dim,):
            raise CorruptEntry(f"entry {entry_id}: bad response or embedding shape")
        return StoredEntry(
            entry_id=entry_id,
            scope=_s(values["scope"]),
            text=_s(values["text"]),
            tenant=_s(values["tenant"]),
            model=_s(values["model"]),
            response=response,
            embedding=vector,
            expires_at=float(_s(values["expires_at"])),
            prompt_tokens=int(_s(values["prompt_tokens"]) or 0),
            completion_tokens=int(_s(values["completion_tokens"]) or 0),
            bound=_s(values["bound"]),
        )
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error) as exc:
        raise CorruptEntry(f"entry {entry_id}: {exc}") from exc


class SemanticStore:
    """Reads and writes semantic entries and their change events in Redis.

    Redis errors propagate (redis.RedisError); callers bound them with their timeout.
    """

    def __init__(
        self, redis: aioredis.Redis, *, prefix: str, dim: int, max_entries: int, stream_maxlen: int, origin: str
    ) -> None:
        self._redis = redis
        self.prefix = prefix
        index = f"{prefix}:{{sem}}"  # the index's one slot (module doc)
        self._expiry = f"{index}:expiry"
        self._events = f"{index}:events"
        self._groups = f"{index}:groups"
        self._group_prefix = f"{index}:group:"
        self._index_add = redis.register_script(_INDEX_ADD)
        self._index_del = redis.register_script(_INDEX_DEL)
        self._entry_set = redis.register_script(_ENTRY_SET)
        self.dim = dim
        self.max_entries = max_entries
        self.stream_maxlen = stream_maxlen
        self.origin = origin

    async def put(
        self,
        entry_id: str,
        *,
        scope: str,
        text: str,
        tenant: str,
        model: str,
        response: dict[str, Any],
        vector: np.ndarray,
        ttl_s: float,
        prompt_tokens: int,
        completion_tokens: int,
        now: float | None = None,
        group: str | None = None,
    ) -> list[str]:
        """Write one entry with a fixed TTL and publish its ``add`` event; beyond max_entries
        evicts from the largest tenant group (module doc) and returns the victims' ids.
        ``group``: the tenant's statistics label (a bounded set), default ``tenant``."""
        now = time.time() if now is None else now
        expires_at = now + ttl_s
        vec = encode_vector(vector)
        fields: dict[str, str | int] = {
            "response": json.dumps(response, separators=(",", ":")),
            "embedding": vec,
            "scope": scope,
            "text": text,
            "tenant": tenant,
            "model": model,
            "created_at": repr(now),
            "expires_at": repr(expires_at),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
        }
        # The entry first, then its `add` event: a worker that sees the event finds the entry.
        # Cut off between the two, the entry is orphaned but invisible (no index lists it) and
        # expires at its TTL.
        await self._entry_set(keys=[entry_key(self.prefix, entry_id)], args=[int(expires_at * 1000), *_pairs(fields)])
        label = tenant if group is None else group
        event = {
            "op": "add",
            "id": entry_id,
            "scope": scope,
            "exp": repr(expires_at),
            "vec": vec,
            "origin": self.origin,
        }
        popped = await self._index_add(
            keys=[self._expiry, self._groups, self._group_prefix + label, self._events],
            args=[
                repr(now),
                self.max_entries,
                self._group_prefix,
                entry_id,
                repr(expires_at),
                label,
                self.stream_maxlen,
                *_pairs(event),
            ],
        )
        evicted = [_s(member) for member in popped]
        await self.delete_ids(evicted)
        return evicted

    async def get_many(self, entry_ids: Sequence[str]) -> list[StoredEntry | None | CorruptEntry]:
        """Re-read entries; per id: the entry, None (gone/expired) or the CorruptEntry error."""
        entries, _ = await self.get_many_and_hash(entry_ids, None)
        return entries

    async def get_many_and_hash(
        self, entry_ids: Sequence[str], hash_key: str | None
    ) -> tuple[list[StoredEntry | None | CorruptEntry], dict[Any, Any]]:
        """``get_many`` plus HGETALL of ``hash_key`` (None: nothing) in the same pipeline, so
        one round trip: the per-entry bound reads its pool's counts so (cache/verify/bound/store.py)."""
        pipe = self._redis.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.hmget(entry_key(self.prefix, entry_id), list(_ENTRY_FIELDS))
        if hash_key is not None:
            pipe.hgetall(hash_key)
        rows = await pipe.execute()
        extra = rows.pop() if hash_key is not None else {}
        out: list[StoredEntry | None | CorruptEntry] = []
        for entry_id, raw in zip(entry_ids, rows, strict=True):
            try:
                out.append(decode_entry(entry_id, raw, self.dim))
            except CorruptEntry as exc:
                out.append(exc)
        return out, extra

    async def delete_ids(self, entry_ids: Iterable[str]) -> int:
        """Delete entries and publish ``del`` events; returns how many keys existed."""
        ids = list(entry_ids)
        existed = 0
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            # one DEL per key in a plain pipeline: the entries live in different slots, and a
            # cluster client sends each to its node (a multi-key DEL would be cross-slot)
            pipe = self._redis.pipeline(transaction=False)
            for entry_id in chunk:
                pipe.delete(entry_key(self.prefix, entry_id))
            existed += sum(int(n) for n in await pipe.execute())
            # entries first: the index never lists an entry whose `del` went out before it was gone
            await self._index_del(
                keys=[self._expiry, self._groups, self._events],
                args=[self._group_prefix, self.stream_maxlen, self.origin, *chunk],
            )
        return existed

    async def delete_where(self, tenant: str | None = None, model: str | None = None) -> list[str]:
        """Delete every entry of a tenant and/or model (None = any); returns the ids deleted."""
        ids = [_s(m) for m in await self._redis.zrange(self._expiry, 0, -1)]
        matched: list[str] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            pipe = self._redis.pipeline(transaction=False)
            for entry_id in chunk:
                pipe.hmget(entry_key(self.prefix, entry_id), ["tenant", "model"])
            for entry_id, (t, m) in zip(chunk, await pipe.execute(), strict=True):
                if (tenant is None or _s(t) == tenant) and (model is None or _s(m) == model):
                    matched.append(entry_id)
        for start in range(0, len(matched), 500):
            await self.delete_ids(matched[start : start + 500])
        return matched

    async def stream_tail(self) -> str:
        """Id of the newest event ("0-0" when the stream is empty): follow from here after a scan."""
        last = await self._redis.xrevrange(self._events, count=1)
        return _s(last[0][0]) if last else "0-0"

    async def scan_live(self, now: float | None = None) -> list[tuple[str, str, np.ndarray, float]]:
        """All unexpired entries as (id, scope, vector, expires_at), for an index rebuild;
        corrupt ones are left out (they are skipped again at lookup)."""
        now = time.time() if now is None else now
        ids = [_s(m) for m in await self._redis.zrangebyscore(self._expiry, now, "+inf")]
        out: list[tuple[str, str, np.ndarray, float]] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            pipe = self._redis.pipeline(transaction=False)
            for entry_id in chunk:
                pipe.hmget(entry_key(self.prefix, entry_id), ["scope", "embedding", "expires_at"])
            for entry_id, (scope, vec, exp) in zip(chunk, await pipe.execute(), strict=True):
                if scope is None or vec is None or exp is None:
                    continue
                try:
                    vector = _vector(vec)
                except (ValueError, binascii.Error):
                    continue
                if vector.shape == (self.dim,):
                    out.append((entry_id, _s(scope), vector, float(_s(exp))))
        return out

    async def read_events(self, after: str, block_ms: int, count: int = 512) -> list[IndexEvent]:
        """Events newer than stream id ``after``; waits up to block_ms for the first one."""
        reply = await self._redis.xread({self._events: after}, count=count, block=block_ms)
        events: list[IndexEvent] = []
        for _stream, items in reply or []:
            for stream_id, fields in items:
                f = {_s(k): v for k, v in fields.items()}
                op = _s(f.get("op"))
                vector = None
                if op == "add":
                    try:
                        vector = _vector(f.get("vec"))
                    except (ValueError, binascii.Error):
                        continue
                events.append(
                    IndexEvent(
                        stream_id=_s(stream_id),
                        op=op,
                        entry_id=_s(f.get("id")),
                        origin=_s(f.get("origin")),
                        scope=_s(f.get("scope")),
                        vector=vector,
                        expires_at=float(_s(f.get("exp")) or 0.0),
                    )
                )
        return events

    async def stream_head(self) -> str:
        """Id of the oldest event still in the (trimmed) stream, "0-0" when empty."""
        first = await self._redis.xrange(self._events, count=1)
        return _s(first[0][0]) if first else "0-0"
